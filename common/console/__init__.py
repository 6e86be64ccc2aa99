"""The process and its console, set up before TensorFlow is imported: the CPU line and kernel set, TensorFlow's
start-up lines kept off standard error, rank-aware logging, the generators' progress.
"""
