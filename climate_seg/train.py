"""Train a climate network: segmentation (Tiramisu, DeepLabv3+) or semi-supervised detection.

    python -m climate_seg.train --config configs/climate_seg/demo_tiramisu.yaml [--set k=v] [--output-dir D]
                                [--resume] [--dry-run]
    python -m climate_seg.train --config configs/climate_seg/demo_detect.yaml      # task: detection
    horovodrun -np 2 -H localhost:2 --gloo python -m climate_seg.train --config ...

The config's ``task`` key (default ``segmentation``) picks the application.
"""

from common.cli import train_main

if __name__ == "__main__":
    # The application (and TensorFlow with it) is imported by run_train, after its signal handlers.
    train_main("climate_seg")
