"""Training-set maxima for scaling, computed once per dataset.

    python -m hep_cnn.maxima --config configs/hep_cnn/demo.yaml [--set data.data_dir=D]

Writes ``channel_maxima.json`` (``data.maxima_file``) into the derived folder
(``data.derived_dir``, default a folder per dataset in ~/.cache/hpc-dl-suite/derived;
never the data folder, which may be read-only): the maximum
of each of the three channels and of the event weight over the training
split; the pipeline divides each channel by its maximum and, with
``weight_normalization: max``, the weights by theirs.  Written atomically.

This module is the command only: computing, writing and reading the maxima live
in ``hep_cnn.data`` beside the pipeline that uses them (which also writes them
when a run finds none).
"""

from __future__ import annotations

import argparse

from common.cli import exit_process, run_command
from common.config import load_config
from hep_cnn.config import HepConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hep_cnn.maxima", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--force", action="store_true", help="replace a maxima file this suite did not write")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from hep_cnn.data import maxima_path, write_maxima

    cfg = load_config(HepConfig, args.config, args.set)
    maxima = write_maxima(cfg, args.force)
    print(f"wrote {maxima_path(cfg)}: channel maxima {maxima['channel_max']}, weight max {maxima['weight_max']:.4g}")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="hep_cnn.maxima"))
