"""horovodrun, started in a fraction of a second.

    python -m common.tools.launch -np 2 -H localhost:2 --gloo python -m cosmoflow.train --config ...

Takes horovodrun's arguments unchanged and runs horovodrun itself (rank output, exit codes, every option),
except for its build check: horovodrun imports TensorFlow in a child process on every launch to ask whether
Horovod was built with Gloo or MPI (about 6 s, and TensorFlow's start-up lines before the ranks' output); this
launcher asks once per installed build and reads the answer back (:func:`common.distributed.launch`).  `make
demo` and the test suite launch their ranks with it.
"""

import sys

from common.cli import exit_process, run_command
from common.distributed import launch


def main(argv=None) -> int:
    """horovodrun's command line, passed through (its own parser answers --help and refuses bad arguments)."""
    return launch(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    exit_process(run_command(main, name="common.tools.launch"))
