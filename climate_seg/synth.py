"""Moved to ``climate_seg.cam5.synth``; this old path works for one release more, with a warning.

(common/_moved.py; docs/engine.md, "Moved modules".)
"""

from common._moved import moved_to

moved_to("climate_seg.cam5.synth", __name__, __spec__)
