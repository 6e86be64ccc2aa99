"""Errors and exit codes.

Exit codes (documented in the README; the SLURM scripts requeue on 75):

====  ==================================================================
0     success
1     a failure during training (an exception on this rank)
2     bad input or configuration: a one-line message naming the file or key
3     the loss became NaN/Inf (the last good checkpoint is kept); a command's output would hold NaN/Inf
      (nothing written)
4     no training progress for ``train.hang_timeout_s`` (a rank died or hung)
75    preempted (SIGTERM/SIGUSR1): a checkpoint was saved; rerun with --resume
130   interrupted (Ctrl-C): one line; a rerun with --resume continues from the newest checkpoint, if any
143   terminated (SIGTERM) outside training (where it is a preemption, 75): one line, outputs as found
====  ==================================================================
"""

import re

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_NONFINITE = 3
EXIT_HUNG = 4
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130   # Ctrl-C (SIGINT), as a shell reports it
EXIT_TERMINATED = 143    # SIGTERM, as a shell reports it


class UserInputError(Exception):
    """Bad input or configuration; the message is shown to the user as is."""


class ConfigError(UserInputError):
    """A config file or override that does not match the schema."""


class DataError(UserInputError):
    """A data directory or file that is missing, malformed or too small."""


class NonFiniteOutput(Exception):
    """A value a command was about to write is NaN or infinite; the message names the input it came from.
    Nothing of the command's outputs was written (exit 3)."""


class Terminated(SystemExit):
    """SIGTERM, raised where the process would otherwise end at once, so that what a command started is undone
    on the way out.  A SystemExit of code 143 (128 + SIGTERM), as KeyboardInterrupt is a BaseException: no
    ``except Exception`` swallows it, and uncaught it ends the process with the shell's code for SIGTERM."""

    def __init__(self, signum: int = 15):
        super().__init__(128 + signum)
        self.signum = signum


class Preempted(Exception):
    """A stop was requested by signal; a checkpoint at the step boundary was saved."""


class NonFiniteLoss(Exception):
    """The loss, the allreduced gradients or the weights became NaN or Inf (beyond what loss scaling may
    skip); the trainer sets ``kept`` (rank 0): the newest checkpoint left, or None."""


def data_error_from_pipeline(exc: Exception) -> DataError | None:
    """The :class:`DataError` a reader raised inside tf.data (numpy_function), if that is what ``exc`` carries
    (TensorFlow wraps it in its own error, the message inside)."""
    match = re.search(r"DataError: ([^\n]+)", str(exc))
    return DataError(match.group(1).strip()) if match else None
