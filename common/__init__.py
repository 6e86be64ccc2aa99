"""The engine shared by every application: configuration, Horovod, precision,
optimizers, schedules, FLOP and throughput accounting, checkpoints and the one
training loop.  Nothing in here knows which science it is training."""

from common import _moved
from common.console import cpu as _cpu
from common.console import quiet as _quiet
from common.console import signals as _signals
from common.storage import scratch as _scratch

# A suite command (python -m <package>.<command>) interrupted while its modules load, before its run_command: one
# line and the shell's code, not the traceback of whichever import the signal landed in (common/console/signals.py).
_signals.quiet_until_run_command()
# Both before TensorFlow is imported, which every entry point does after importing this package.
# TensorFlow's C++ start-up chatter (oneDNN, CPU feature notices) drowns the training output of every
# rank; errors still show, and a TF_CPP_MIN_LOG_LEVEL the user set to ask for more (0, 1) turns the filter
# off (common/console/quiet.py).
_quiet.install()
# Temporary files (TensorFlow's AutoGraph sources among them) in a folder of this process's, removed at its end.
_scratch.install()
# The old module paths, for one release (common/_moved.py).
_moved.install()
# oneDNN kernels on every x86 CPU, not only where TensorFlow enables them by default (common/console/cpu.py).
_cpu.enable_onednn()
