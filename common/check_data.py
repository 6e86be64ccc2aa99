"""Moved to ``common.tools.check_data``; this old path works for one release more, with a warning.

(common/_moved.py; docs/engine.md, "Moved modules".)
"""

from common._moved import moved_to

moved_to("common.tools.check_data", __name__, __spec__)
