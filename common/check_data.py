"""Validate a dataset before a long job and report every problem.

    python -m common.check_data --config configs/cosmoflow/mlperf.yaml [--set data.data_dir=D] [--app cosmoflow]

Reads every file of every split the way training would, but all the way
through: checksums, shapes, dtypes, NaN/Inf, label ranges.  Prints one line
per problem and a summary; exits 0 when the data is clean and 2 otherwise.
The application comes from ``--app``, else the config's ``model.name``, else
the config's folder (``configs/<app>/...``).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib

from common.cli import exit_on_user_error, exit_process
from common.config import load_config, read_yaml
from common.errors import EXIT_BAD_INPUT, ConfigError


def find_application(config_path: str, app_name: str | None):
    candidates = [app_name] if app_name else []
    raw = read_yaml(config_path)
    if isinstance(raw.get("model"), dict) and raw["model"].get("name"):
        candidates.append(raw["model"]["name"])
    candidates.append(pathlib.Path(config_path).resolve().parent.name)
    for name in candidates:
        try:
            module = importlib.import_module(f"{name}.train")
        except ImportError:
            continue
        application = getattr(module, "APPLICATION", None)
        if hasattr(module, "application_for"):   # a package with several applications picks one from the config
            application = module.application_for(config_path)
        if application is not None:
            return application
    raise ConfigError(f"{config_path}: cannot tell which application it configures; pass --app NAME")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.check_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--app", help="application package (cosmoflow, hep_cnn, ...)")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        application = find_application(args.config, args.app)
        if application.check_data is None:
            raise ConfigError(f"{application.name} has no data checker")
        cfg = load_config(application.config_schema, args.config, args.set)
        checked, problems = application.check_data(cfg)
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{application.name}: checked {checked} files in {cfg.data.data_dir}: "
          + (f"{len(problems)} problem(s)" if problems else "no problems"))
    return EXIT_BAD_INPUT if problems else 0


if __name__ == "__main__":
    exit_process(main())
