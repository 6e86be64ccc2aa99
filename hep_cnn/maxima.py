"""Training-set maxima for scaling, stored beside the data.

    python -m hep_cnn.maxima --config configs/hep_cnn/demo.yaml [--set data.data_dir=D]

Writes ``DATA_DIR/channel_maxima.json`` (``data.maxima_file``): the maximum
of each of the three channels and of the event weight over the training
split; the pipeline divides each channel by its maximum and, with
``weight_normalization: max``, the weights by theirs.  Written atomically.
"""

from __future__ import annotations

import argparse
import sys

from common.cli import exit_on_user_error
from common.config import load_config
from common.storage.outputs import check_replaceable, write_json
from hep_cnn.config import HepConfig


def write_maxima(cfg, force: bool = False) -> dict:
    """Compute and write the maxima; a file there that this suite did not write is kept (an error)."""
    from hep_cnn.data import compute_maxima, maxima_path   # deferred: TensorFlow, and hep_cnn.data imports this module

    path = maxima_path(cfg)
    check_replaceable(path, force, "pass --force to replace it, or set data.maxima_file to another name")
    maxima = compute_maxima(cfg)
    write_json(path, maxima, "hep_cnn.maxima", force)
    return maxima


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hep_cnn.maxima", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--force", action="store_true", help="replace a maxima file this suite did not write")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
        from hep_cnn.data import maxima_path

        cfg = load_config(HepConfig, args.config, args.set)
        maxima = write_maxima(cfg, args.force)
        print(f"wrote {maxima_path(cfg)}: channel maxima {maxima['channel_max']}, weight max {maxima['weight_max']:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
