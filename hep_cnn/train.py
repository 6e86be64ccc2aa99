"""Train the HEP CNN.

    python -m hep_cnn.train --config configs/hep_cnn/demo.yaml [--set k=v] [--output-dir D] [--resume] [--dry-run]
    horovodrun -np 2 -H localhost:2 --gloo python -m hep_cnn.train --config ...
"""

from common.cli import exit_process, run_train

if __name__ == "__main__":
    # The application (and TensorFlow with it) is imported by run_train, after its signal handlers.
    exit_process(run_train("hep_cnn"))
