"""The engine shared by every application: configuration, Horovod, precision,
optimizers, schedules, FLOP and throughput accounting, checkpoints and the one
training loop.  Nothing in here knows which science it is training."""

import os as _os

# TensorFlow's C++ start-up chatter (oneDNN, CPU feature notices) drowns the
# training output of every rank; errors still show.  Set before TF is imported.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
