"""Moved to ``common.console.progress``; this old path works for one release more, with a warning.

(common/_moved.py; docs/engine.md, "Moved modules".)
"""

from common._moved import moved_to

moved_to("common.console.progress", __name__, __spec__)
