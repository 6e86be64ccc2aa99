"""Moved to ``common.nn.layers``; this old path works for one release more, with a warning.

(common/_moved.py; docs/engine.md, "Moved modules".)
"""

from common._moved import moved_to

moved_to("common.nn.layers", __name__, __spec__)
