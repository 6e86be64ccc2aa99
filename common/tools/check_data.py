"""Validate a dataset before a long job and report every problem.

    python -m common.tools.check_data --config configs/cosmoflow/mlperf.yaml [--set data.data_dir=D] [--app cosmoflow]

Reads every file of every split the way training would, but all the way
through: checksums, shapes, dtypes, NaN/Inf, label ranges.  Prints one line
per problem and a summary; exits 0 when the data is clean and 2 otherwise.
The application comes from ``--app``, else the config's ``model.name``, else
the config's folder (``configs/<app>/...``).
"""

from __future__ import annotations

import argparse

from common.cli import exit_process, find_application, run_command
from common.config import load_config
from common.errors import EXIT_BAD_INPUT, ConfigError, DataError, UserInputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m common.tools.check_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--app", help="the application's package, one registered in pyproject.toml "
                                       "(default: the config's model.name, else its folder)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    application = find_application(args.config, args.app)
    cfg = load_config(application.config_schema, args.config, args.set)   # checked before TensorFlow loads
    if application.check_data is None:   # the application's TensorFlow half, imported here
        raise ConfigError(f"{application.name} has no data checker")
    try:
        checked, problems = application.check_data(cfg)
    except UserInputError:
        raise
    except Exception as exc:   # noqa: BLE001  a checker reports; it never ends in a traceback
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DataError(f"{cfg.data.data_dir}: the check stopped ({type(exc).__name__}"
                        f"{': ' + detail[:300] if detail else ''})") from None
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{application.name}: checked {checked} files in {cfg.data.data_dir}: "
          + (f"{len(problems)} problem(s)" if problems else "no problems"))
    return EXIT_BAD_INPUT if problems else 0


if __name__ == "__main__":
    exit_process(run_command(main, name="common.tools.check_data"))
