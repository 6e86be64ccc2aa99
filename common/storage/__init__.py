"""Files: atomic writes and the suite's marks, run directories (their kind and lock), the output transaction,
generated folders, checkpoints, a split's sample files and their node-local staging, TFRecord reading, plots.
"""
