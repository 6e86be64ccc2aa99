"""horovodrun, started in a fraction of a second.

    python -m common.tools.launch -np 2 -H localhost:2 --gloo python -m cosmoflow.train --config ...

Takes horovodrun's arguments unchanged and runs horovodrun itself (rank output, exit codes, every option),
except for its build check: horovodrun imports TensorFlow in a child process on every launch to ask whether
Horovod was built with Gloo or MPI (about 6 s, and TensorFlow's start-up lines before the ranks' output); this
launcher asks once per installed build and reads the answer back (:func:`common.distributed.launch`).  `make
demo` and the test suite launch their ranks with it.
"""

import sys

from common.cli import exit_on_user_error
from common.distributed import launch

if __name__ == "__main__":
    with exit_on_user_error():
        code = launch(sys.argv[1:])
    sys.exit(code)
