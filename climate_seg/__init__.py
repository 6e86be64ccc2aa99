"""Climate analytics on CAM5 fields (SC17, SC18): pixel masks of extreme weather
(Tiramisu, DeepLabv3+) and semi-supervised boxes around weather events."""

import common  # noqa: F401,E402  (first: the engine sets up TensorFlow's environment before anything imports it)

from common import _moved

# Modules of this package that moved, kept at their old paths for one release (common/_moved.py).
_moved.register({
    "climate_seg.convert": "climate_seg.cam5.convert",
    "climate_seg.stats": "climate_seg.cam5.stats",
    "climate_seg.synth": "climate_seg.cam5.synth",
    "climate_seg.boxes": "climate_seg.detection.boxes",
    "climate_seg.deeplab": "climate_seg.segmentation.deeplab",
    "climate_seg.tiramisu": "climate_seg.segmentation.tiramisu",
})
