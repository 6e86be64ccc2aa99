"""CosmoFlow: a 3D CNN regressing cosmological parameters from dark-matter
particle-count volumes (Mathuriya et al., SC18; MLPerf HPC CosmoFlow)."""

import common  # noqa: F401,E402  (first: the engine sets up TensorFlow's environment before anything imports it)
