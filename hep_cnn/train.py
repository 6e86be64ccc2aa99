"""Train the HEP CNN.

    python -m hep_cnn.train --config configs/hep_cnn/demo.yaml [--set k=v] [--output-dir D] [--resume] [--dry-run]
    horovodrun -np 2 -H localhost:2 --gloo python -m hep_cnn.train --config ...
"""

from common.cli import train_main

if __name__ == "__main__":
    # The application (and TensorFlow with it) is imported by run_train, after its signal handlers.
    train_main("hep_cnn")
