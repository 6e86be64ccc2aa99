"""Climate analytics on CAM5 fields (SC17, SC18): pixel masks of extreme weather
(Tiramisu, DeepLabv3+) and semi-supervised boxes around weather events."""

import common  # noqa: F401,E402  (first: the engine sets up TensorFlow's environment before anything imports it)
