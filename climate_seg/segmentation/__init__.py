"""Climate segmentation: per-pixel masks of tropical cyclones and atmospheric rivers (Tiramisu, DeepLabv3+; SC18)."""
