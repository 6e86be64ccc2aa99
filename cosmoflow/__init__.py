"""CosmoFlow: a 3D CNN regressing cosmological parameters from dark-matter
particle-count volumes (Mathuriya et al., SC18; MLPerf HPC CosmoFlow)."""
