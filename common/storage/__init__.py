"""Files: guarded atomic outputs and the run-folder lock, checkpoints, the data folder's screening and staging,
TFRecord reading, training-curve plots.
"""
