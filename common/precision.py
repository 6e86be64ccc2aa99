"""Moved to ``common.nn.precision``; this old path works for one release more, with a warning.

(common/_moved.py; docs/engine.md, "Moved modules".)
"""

from common._moved import moved_to

moved_to("common.nn.precision", __name__, __spec__)
