"""Train CosmoFlow.

    python -m cosmoflow.train --config configs/cosmoflow/demo.yaml [--set k=v] [--output-dir D] [--resume] [--dry-run]
    horovodrun -np 2 -H localhost:2 --gloo python -m cosmoflow.train --config ...
"""

from common.cli import train_main

if __name__ == "__main__":
    # The application (and TensorFlow with it) is imported by run_train, after its signal handlers.
    train_main("cosmoflow")
