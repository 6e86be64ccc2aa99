"""HEP CNN: RPV-SUSY signal vs QCD background on calorimeter images
(Kurth et al., "Deep Learning at 15PF", SC17), judged against the cut-based
selection the physicists use."""

import common  # noqa: F401,E402  (first: the engine sets up TensorFlow's environment before anything imports it)
