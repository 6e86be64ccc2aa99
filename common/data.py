"""Moved to ``common.storage.data``; this old path works for one release more, with a warning.

(common/_moved.py; docs/engine.md, "Moved modules".)
"""

from common._moved import moved_to

moved_to("common.storage.data", __name__, __spec__)
