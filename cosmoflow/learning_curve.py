"""Validation MAE against training-set size: trained networks beside the P(k) regression, per parameter.

    python -m cosmoflow.information --config configs/cosmoflow/science.yaml --bins 12 \\
        --features power+pdf --train-sizes 256,512,1024,2048 --json curve.json
    python -m cosmoflow.learning_curve --information curve.json --out learning_curve.png \\
        --series "reference (flatten)" runs/n512-s0 runs/n512-s1 runs/n2048-s0 \\
        --series "global average pooling" runs/avg-n512-s0 ... [--json learning_curve.json]

With ``--regressions power,power+log_power+cross+one_point`` the regressions drawn are those summary sets of the
information JSON's ``learning_curves`` (default: its ``power`` and ``power+pdf`` curves); each ``--bound FILE``
(the JSON of ``cosmoflow.information``, with ``--summary-fisher`` for the summaries' bound) adds the Fisher bounds
it holds as horizontal lines, their best MAE over the validation set's training-mean MAE; ``--earlier FILE``
(an earlier ``--json`` of this tool) adds the network series it holds, for runs whose folders are gone, and
``--extend LABEL RUN...`` adds runs to one of them (its points recomputed over its earlier runs and these).

Each run directory is a finished training (``python -m cosmoflow.train``, any ``data.n_train``) evaluated on
its validation split (``python -m cosmoflow.evaluate``): its size is the ``train_samples_per_epoch`` of its
``summary.json``, its MAE per parameter that of its ``metrics.json`` over the training-mean baseline's.
Each ``--series`` is a label and its runs (one network configuration at several sizes); its runs of one size
are averaged (mean and standard deviation over seeds).  The runs and the regression must have read the same
data folder.  The figure has one panel per parameter: MAE / training-mean MAE (1 = the mean, 0 = perfect) on
a log scale against training volumes, each series with its spread over seeds, the regression on log P(k)
(and on P(k) with one-point statistics when it was computed) with its spread over training draws.  The runs'
``history.csv`` gives, in the JSON, each run's validation MAE per epoch (the trainer's: batch-norm moving
averages, not the re-estimated statistics of the final model).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import yaml

from common.cli import exit_process, run_command
from common.deferred import pyplot as plt
from common.errors import UserInputError
from common.storage.outputs import sha256_of
from common.storage.plots import read_history
from common.storage.transaction import OutputTransaction, Producer

TOOL = "cosmoflow.learning_curve"

# Imported where used, not here: matplotlib's pyplot, only where the figure is drawn.

PANELS = ("Omega_m", "sigma_8", "n_s", "H0")
REGRESSIONS = {"power": "ridge on log P(k)", "power+pdf": "ridge on log P(k) + one-point",
               "power+log_power+cross+one_point": "ridge on all the summaries"}
REGRESSION_STYLES = [dict(color="C1", marker="s", ls="--"), dict(color="C2", marker="^", ls=":"),
                     dict(color="C8", marker="v", ls="-."), dict(color="C9", marker="D", ls="--")]
BOUND_STYLES = [dict(color="0.35", ls=(0, (4, 2)), lw=1.1), dict(color="0.6", ls=(0, (1, 1.5)), lw=1.1),
                dict(color="0.1", ls=(0, (6, 1.5, 1, 1.5)), lw=1.1)]


def regression_label(name: str) -> str:
    return REGRESSIONS.get(name, f"ridge on {name}")


def _read_json(path: pathlib.Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"{path}: not found ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{path}: not readable as JSON ({exc}); expected {what}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: holds a JSON {type(data).__name__}; expected {what} (an object)")
    return data


def _mapping(value, where: str, what: str = "an object") -> dict:
    if not isinstance(value, dict) or not value:
        raise UserInputError(f"{where}: expected {what}, got {_shown(value)}")
    return value


def _number(value, where: str, low: float = 0.0, strict: bool = True) -> float:
    """A finite number above ``low`` (or at least, with ``strict`` False), or a one-line error naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) \
            or (value <= low if strict else value < low):
        raise UserInputError(f"{where}: expected a finite number {'above' if strict else 'at least'} {low:g}, "
                             f"got {_shown(value)}")
    return float(value)


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_curve(curve, where: str) -> dict:
    """A curve as the tools write it, ``{size: {parameter: {"ratio_mean", "ratio_std", ...}}}``, checked."""
    for size, rows in _mapping(curve, where, "a curve {size: {parameter: {ratio_mean, ratio_std}}}").items():
        if not size.isdigit() or int(size) < 1:
            raise UserInputError(f"{where}: size {size!r}: expected a number of training volumes")
        for name, row in _mapping(rows, f"{where}.{size}").items():
            row = _mapping(row, f"{where}.{size}.{name}")
            _number(row.get("ratio_mean"), f"{where}.{size}.{name}.ratio_mean")
            _number(row.get("ratio_std"), f"{where}.{size}.{name}.ratio_std", strict=False)
    return curve


def read_run(run_dir) -> dict:
    """One evaluated training run: its data folder, training-set size, seed, and per parameter the validation
    MAE and its ratio to the training-mean baseline (and, when ``history.csv`` has them, per epoch)."""
    run_dir = pathlib.Path(run_dir)
    metrics = _read_json(run_dir / "metrics.json", "python -m cosmoflow.evaluate --run-dir RUN writes it")
    summary = _read_json(run_dir / "summary.json", "a finished python -m cosmoflow.train run writes it")
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError(f"{run_dir / 'config.yaml'}: not readable ({exc}); expected the run's config") from None
    if not all(isinstance(metrics.get(key), dict) for key in ("mae", "baseline_mae")):
        raise UserInputError(f"{run_dir / 'metrics.json'}: no mae and baseline_mae; expected the metrics of "
                             "python -m cosmoflow.evaluate")
    if metrics.get("split") != "validation":
        raise UserInputError(f"{run_dir / 'metrics.json'}: evaluated on split {metrics.get('split')!r}; expected "
                             f"'validation' (python -m cosmoflow.evaluate --run-dir {run_dir} --split validation)")
    check_own_evaluation(run_dir, metrics, config)
    size = summary.get("train_samples_per_epoch")
    if not isinstance(size, int) or size < 1:
        raise UserInputError(f"{run_dir / 'summary.json'}: no train_samples_per_epoch; expected a finished training's summary")
    names = list(metrics["mae"])
    history = read_history(run_dir / "history.csv") if (run_dir / "history.csv").is_file() else {}
    return {
        "run_dir": str(run_dir), "train_samples": size, "seed": config["train"]["seed"],
        "data_dir": str(pathlib.Path(config["data"]["data_dir"]).resolve()),
        "mae": {n: metrics["mae"][n] for n in names},
        "ratio": {n: metrics["mae"][n] / metrics["baseline_mae"][n] for n in names},
        "epochs": {n: [v / metrics["baseline_mae"][n] for v in history[f"val_mae_{n}"]]
                   for n in names if f"val_mae_{n}" in history},
    }


def check_own_evaluation(run_dir: pathlib.Path, metrics: dict, config: dict) -> None:
    """The run's point is its own: ``metrics.json`` records an evaluation of the run's data folder (not one made
    with ``--data-dir`` elsewhere) and of the network now in ``model.keras`` (not one a resumed training has
    replaced since)."""
    again = f"evaluate it again: python -m cosmoflow.evaluate --run-dir {run_dir}"
    evaluated = metrics.get("evaluated")
    if not isinstance(evaluated, dict):
        raise UserInputError(f"{run_dir / 'metrics.json'}: does not record which data folder and model it evaluated "
                             f"(written before evaluations recorded them); {again}")
    own = str(pathlib.Path(config["data"]["data_dir"]).resolve())
    if evaluated.get("data_dir") != own:
        raise UserInputError(f"{run_dir / 'metrics.json'}: an evaluation of {evaluated.get('data_dir')}, not of the "
                             f"run's data folder {own}; the curve draws each run on its own validation split: {again}")
    if evaluated.get("model_sha256") != sha256_of(run_dir / "model.keras"):
        raise UserInputError(f"{run_dir / 'metrics.json'}: an evaluation of another model than {run_dir / 'model.keras'} "
                             f"(trained further since?); {again}")


def network_curve(runs: list[dict]) -> dict:
    """Per training-set size and parameter: mean and standard deviation of the MAE ratio over the runs."""
    curve = {}
    for size in sorted({run["train_samples"] for run in runs}):
        group = [run for run in runs if run["train_samples"] == size]
        curve[str(size)] = {name: {"ratio_mean": float(np.mean([r["ratio"][name] for r in group])),
                                   "ratio_std": float(np.std([r["ratio"][name] for r in group])),
                                   "mae_mean": float(np.mean([r["mae"][name] for r in group])),
                                   "runs": len(group), "seeds": sorted(r["seed"] for r in group)}
                            for name in group[0]["ratio"]}
    return curve


def check_same_data(information: dict, runs: list[dict], information_path) -> None:
    """The regression and every run read one data folder, or a one-line error naming both."""
    folders = {run["data_dir"] for run in runs}
    if len(folders) > 1:
        raise UserInputError(f"the runs read different data folders ({', '.join(sorted(folders))}); "
                             "a learning curve compares runs on one dataset")
    if information.get("data_dir") not in folders:
        raise UserInputError(f"{information_path}: the regression read {information.get('data_dir')}, the runs "
                             f"{folders.pop()}; expected the same folder")


def select_regressions(information: dict, names: str | None, path) -> dict:
    """The regression curves to draw: ``names`` (comma-separated summary sets of ``learning_curves``), or the
    legacy ``learning_curve`` ones; a one-line error naming the file and what it holds otherwise."""
    if names is None:
        regressions = information.get("learning_curve")
        if not regressions:
            raise UserInputError(f"{path}: no learning_curve; expected the JSON of python -m cosmoflow.information "
                                 "--train-sizes 256,512,...")
        return {name: check_curve(curve, f"{path}: learning_curve.{name}")
                for name, curve in _mapping(regressions, f"{path}: learning_curve").items()}
    held = {}
    for key in ("learning_curve", "learning_curves"):
        if information.get(key) is not None:
            held.update(_mapping(information[key], f"{path}: {key}", "an object of learning curves"))
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    missing = [name for name in wanted if name not in held]
    if not wanted or missing:
        raise UserInputError(f"{path}: no learning curve of {', '.join(missing) or '(none named)'} for --regressions; "
                             f"it holds {', '.join(held) or 'none'} (python -m cosmoflow.information --features ... "
                             "--train-sizes ...)")
    return {name: check_curve(held[name], f"{path}: learning curve {name}") for name in wanted}


def read_bounds(paths: list[str], information: dict, information_path) -> dict[str, dict[str, float]]:
    """``{label: {parameter: best MAE / training-mean MAE}}`` of the Fisher bounds in each ``--bound`` JSON:
    the linear bound and, when computed, the summaries' bound; the denominator is the regression's
    training-mean MAE on the validation set (the same as the runs')."""
    if not paths:
        return {}
    regression = _mapping(information.get("regression"), f"{information_path}: regression",
                          "the regression of python -m cosmoflow.information")
    baseline = {name: _number(_mapping(row, f"{information_path}: regression.{name}").get("baseline_mae"),
                              f"{information_path}: regression.{name}.baseline_mae")
                for name, row in regression.items()}

    def ratios(rows, where: str) -> dict[str, float]:
        return {name: _number(_mapping(row, f"{where}.{name}").get("best_mae"), f"{where}.{name}.best_mae")
                / baseline[name] for name, row in _mapping(rows, where).items() if name in baseline}

    bounds = {}
    for path in paths:
        report = _read_json(pathlib.Path(path), "the JSON of python -m cosmoflow.information")
        if report.get("grid") != information.get("grid") or report.get("box_size_mpc_h") != information.get("box_size_mpc_h"):
            raise UserInputError(f"{path}: a bound for {report.get('grid')}^3 voxels of a {report.get('box_size_mpc_h')} "
                                 f"Mpc/h box, the regression's volumes are {information.get('grid')}^3 of "
                                 f"{information.get('box_size_mpc_h')}; expected the same volumes")
        found = False
        if report.get("fisher") is not None:
            bounds.setdefault("linear Fisher bound (initial field)", ratios(report["fisher"], f"{path}: fisher"))
            found = True
        summary = report.get("summary_fisher")
        if summary is not None:
            summary = _mapping(summary, f"{path}: summary_fisher")
            label = f"Fisher bound of {summary.get('summaries_used')} summaries ({summary.get('features')}, " \
                    f"{report.get('bins')} bins)"
            bounds[label] = ratios(summary.get("parameters"), f"{path}: summary_fisher.parameters")
            found = True
        if not found:
            raise UserInputError(f"{path}: no fisher or summary_fisher; expected the JSON of python -m "
                                 "cosmoflow.information [--summary-fisher]")
    return bounds


def check_label(label: str, where: str) -> str:
    """A series label as the legend and ``--json`` can carry it: printable text on one line, no spaces at its
    ends, not starting with '_' (matplotlib leaves such labels out of the legend)."""
    if not isinstance(label, str) or not label.strip() or not label.isprintable() or label != label.strip() \
            or label.startswith("_"):
        raise UserInputError(f"{where} {label!r}: expected a label of printable characters on one line (no tabs, "
                             "newlines or control characters), without spaces at its ends or a leading '_'")
    return label


def legend_text(label: str) -> str:
    """``label`` drawn as written: '$' would start matplotlib's mathtext."""
    return label.replace("$", r"\$")


def read_earlier(path, information: dict) -> dict[str, dict]:
    """The network series of an earlier ``--json`` of this tool, checked to be on the regression's data."""
    earlier = _read_json(pathlib.Path(path), "an earlier --json of python -m cosmoflow.learning_curve")
    if not isinstance(earlier.get("networks"), dict) or not isinstance(earlier.get("runs"), dict):
        raise UserInputError(f"{path}: no networks and runs; expected an earlier --json of python -m "
                             "cosmoflow.learning_curve")
    folders = set()
    for label, curve in _mapping(earlier["networks"], f"{path}: networks").items():
        check_label(label, f"{path}: networks")
        check_curve(curve, f"{path}: networks.{label}")
        group = earlier["runs"].get(label)
        if not isinstance(group, list) or not group or not all(isinstance(run, dict) for run in group):
            raise UserInputError(f"{path}: runs.{label}: expected the list of the series' runs, got {_shown(group)}")
        folders |= {str(run.get("data_dir")) for run in group}
    folded = [label.casefold() for label in earlier["networks"]]
    if len(set(folded)) != len(folded) or set(earlier["runs"]) != set(earlier["networks"]):
        raise UserInputError(f"{path}: its networks' labels differ only in case, or its runs are of other labels "
                             "than its networks; expected an earlier --json of python -m cosmoflow.learning_curve")
    if folders != {information.get("data_dir")}:
        raise UserInputError(f"{path}: its runs read {', '.join(sorted(map(str, folders)))}, the regression "
                             f"{information.get('data_dir')}; expected the same folder")
    return earlier


def extend_series(earlier: dict, label: str, directories: list[str], earlier_path) -> list[dict]:
    """The runs of the ``--earlier`` series ``label`` (each checked: what a point is computed from) followed by
    those in ``directories`` (read as ``--series`` reads its runs); a one-line error for a label the file's
    networks lack or a run record it cannot use."""
    if label not in earlier["networks"]:
        raise UserInputError(f"--extend {label}: not a series of --earlier {earlier_path} (it holds "
                             f"{', '.join(earlier['networks']) or 'none'})")
    runs = []
    for number, run in enumerate(earlier["runs"][label]):
        where = f"{earlier_path}: runs.{label}[{number}]"
        size, seed = run.get("train_samples"), run.get("seed")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 \
                or isinstance(seed, bool) or not isinstance(seed, int):
            raise UserInputError(f"{where}: expected train_samples a whole number of at least 1 and a whole seed, "
                                 f"got {_shown(size)} and {_shown(seed)}")
        for key in ("mae", "ratio"):
            for name, value in _mapping(run.get(key), f"{where}.{key}").items():
                _number(value, f"{where}.{key}.{name}")
        if set(run["mae"]) != set(run["ratio"]):
            raise UserInputError(f"{where}: mae names {', '.join(sorted(run['mae']))}, ratio "
                                 f"{', '.join(sorted(run['ratio']))}; expected the same parameters")
        runs.append(run)
    return runs + [read_run(directory) for directory in directories]


def check_series(label: str, runs: list[dict], option: str) -> None:
    """One series' runs: each a different training (neither the same folder, however named, nor the same seed
    at the same size: a point would count one run twice), all with the same parameters."""
    folders, trainings = {}, {}
    names = set(runs[0]["ratio"])
    for run in runs:
        where = str(run.get("run_dir"))
        if set(run["ratio"]) != names or set(run["mae"]) != names:
            raise UserInputError(f"{option} {label}: {where} has the parameters {', '.join(sorted(run['ratio']))}, "
                                 f"the series {', '.join(sorted(names))}; expected the same")
        folder = str(pathlib.Path(where).resolve())
        training = (run["seed"], run["train_samples"])
        if folder in folders or training in trainings:
            other = folders.get(folder) or trainings[training]
            raise UserInputError(f"{option} {label}: {where} is "
                                 + ("the run folder of " + other if folder in folders else
                                    f"seed {training[0]} at {training[1]} volumes, as {other} is")
                                 + "; a point would count one training twice")
        folders[folder] = trainings[training] = where


def plot(networks: dict[str, dict], regressions: dict, title: str, bounds: dict | None = None):
    """One panel per parameter: MAE / training-mean MAE against training volumes (the figure)."""
    names = [n for n in PANELS if any(n in rows for curve in networks.values() for rows in curve.values())]
    fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.6), squeeze=False)
    colours = ["C0", "C3", "C4", "C5", "C6", "k", "teal", "goldenrod"]   # the regressions' are C1, C2, C8, C9
    markers = ["o", "P", "X", "*"]   # a marker for each round of the colours
    series = [(label, curve, dict(color=colours[i % len(colours)], marker=markers[i // len(colours) % len(markers)],
                                  lw=1.6))
              for i, (label, curve) in enumerate(networks.items())]
    series += [(regression_label(key), curve, REGRESSION_STYLES[i % len(REGRESSION_STYLES)])
               for i, (key, curve) in enumerate(regressions.items())]
    for axis, name in zip(axes[0], names):
        for i, (label, curve, style) in enumerate(series):
            sizes = [int(n) for n in curve if name in curve[n]]
            dodge = 1.03 ** (i - (len(series) - 1) / 2)   # series at one size side by side, not on top of each other
            axis.errorbar([n * dodge for n in sizes], [curve[str(n)][name]["ratio_mean"] for n in sizes],
                          yerr=[curve[str(n)][name]["ratio_std"] for n in sizes], capsize=3, ms=4,
                          label=legend_text(label), **style)
        for i, (label, bound) in enumerate((bounds or {}).items()):
            if name in bound:
                axis.axhline(bound[name], label=legend_text(label), **BOUND_STYLES[i % len(BOUND_STYLES)])
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        plain = plt.FuncFormatter(lambda value, _: f"{value:.2g}")
        axis.xaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.yaxis.set_major_formatter(plain)
        low, high = axis.get_ylim()
        # every minor tick labelled within a decade; over more, those at 2, 3 and 5 only (labels would overlap)
        axis.yaxis.set_minor_formatter(plain if high / low < 10 else plt.FuncFormatter(
            lambda value, _: f"{value:.2g}" if f"{value:.0e}"[0] in "235" else ""))
        axis.tick_params(axis="y", which="both", labelsize=7)
        axis.set_title(name)
        axis.set_xlabel("training volumes")
        axis.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("validation MAE / training-mean MAE")
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows = -(-len(labels) // 3)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8, frameon=False)
    fig.suptitle(legend_text(title), fontsize=9)
    fig.tight_layout(rect=(0, 0.045 + 0.045 * rows, 1, 1))
    return fig


def check_outputs(transaction: OutputTransaction, out: str, json_path: str | None) -> None:
    """Both outputs checked before anything is drawn or written: a PNG figure, a JSON elsewhere, each absent or
    this command's (or ``--force``), in a folder that can be written, neither one of the inputs."""
    if not out.lower().endswith(".png"):
        raise UserInputError(f"--out {out}: expected a .png file (the figure)")
    if json_path and pathlib.Path(json_path).resolve() == pathlib.Path(out).resolve():
        raise UserInputError(f"--json {json_path}: the same file as --out; name another")
    transaction.check([out, *([json_path] if json_path else [])],
                      options={out: "--out", **({json_path: "--json"} if json_path else {})})


def inputs_of(args) -> list[pathlib.Path]:
    """Every file the command reads: the JSONs named, and each run's records."""
    files = [pathlib.Path(args.information), *map(pathlib.Path, args.bound)]
    if args.earlier:
        files.append(pathlib.Path(args.earlier))
    for _, *directories in (*args.series, *args.extend):
        for run in map(pathlib.Path, directories):
            files += [run / name for name in ("metrics.json", "summary.json", "config.yaml", "history.csv",
                                              "model.keras")]
    return files


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cosmoflow.learning_curve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--information", required=True, help="JSON of python -m cosmoflow.information --train-sizes ...")
    parser.add_argument("--series", nargs="+", action="append", default=[], metavar="LABEL_THEN_RUNS",
                        help="a label, then its evaluated training run directories (repeatable)")
    parser.add_argument("--regressions", metavar="SETS",
                        help="comma-separated summary sets of the information JSON's learning_curves to draw "
                             "(default: its power and power+pdf curves)")
    parser.add_argument("--bound", action="append", default=[], metavar="JSON",
                        help="a JSON of python -m cosmoflow.information [--summary-fisher]: its Fisher bounds as "
                             "horizontal lines (repeatable)")
    parser.add_argument("--earlier", metavar="JSON",
                        help="an earlier --json of this tool: its network series drawn too (their runs' folders "
                             "may be gone)")
    parser.add_argument("--extend", nargs="+", action="append", default=[], metavar="LABEL_THEN_RUNS",
                        help="a series of --earlier, then more of its evaluated run directories (repeatable)")
    parser.add_argument("--out", required=True, help="the figure (PNG)")
    parser.add_argument("--json", help="also write the curves to this file")
    parser.add_argument("--title", default="CosmoFlow: validation MAE against training-set size")
    parser.add_argument("--force", action="store_true", help="replace outputs this tool did not write")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    transaction = OutputTransaction(Producer(TOOL, "cosmoflow"), args.force, inputs=inputs_of(args))
    check_outputs(transaction, args.out, args.json)
    information = _read_json(pathlib.Path(args.information), "the JSON of python -m cosmoflow.information")
    regressions = select_regressions(information, args.regressions, args.information)
    earlier = read_earlier(args.earlier, information) if args.earlier else {"networks": {}, "runs": {}}
    for label, *_ in (*args.series, *args.extend):
        check_label(label, "--series/--extend")
    taken = {label.casefold() for label in earlier["networks"]}
    series = {}
    for label, *directories in args.series:
        if label.casefold() in taken:
            raise UserInputError(f"--series {label}: the label is a series of --earlier {args.earlier} already; "
                                 "choose another")
        if not directories or label.casefold() in {name.casefold() for name in series}:
            raise UserInputError(f"--series {label}: expected a new label followed by run directories")
        series[label] = [read_run(run) for run in directories]
        check_series(label, series[label], "--series")
    extended = {}
    for label, *directories in args.extend:
        if not args.earlier or not directories or label in extended:
            raise UserInputError(f"--extend {label}: expected --earlier JSON, then a series of it once, "
                                 "followed by run directories")
        extended[label] = extend_series(earlier, label, directories, args.earlier)
        check_series(label, extended[label], "--extend")
    if not series and not earlier["networks"]:
        raise UserInputError("no networks to draw: give --series LABEL RUN_DIR... or --earlier JSON")
    runs = [run for group in (*series.values(), *extended.values()) for run in group]
    if runs:
        check_same_data(information, runs, args.information)
    bounds = read_bounds(args.bound, information, args.information)
    networks = {**earlier["networks"], **{label: check_curve(network_curve(group), f"the series {label}")
                                          for label, group in (*extended.items(), *series.items())}}
    others = {label.casefold() for label in (*map(regression_label, regressions), *bounds)}
    for label in networks:
        if label.casefold() in others:
            raise UserInputError(f"--series {label}: the label of a regression or bound drawn too; choose another")
    print("validation MAE / training-mean MAE, mean +- std (networks: over seeds; ridge: over training draws)")
    for label, curve in list(networks.items()) + [(regression_label(k), c) for k, c in regressions.items()]:
        print(f"  {label}:")
        for size, rows in curve.items():
            print(f"    {int(size):>6} volumes: " + ", ".join(f"{n} {r['ratio_mean']:.3f} +- {r['ratio_std']:.3f}"
                                                          for n, r in rows.items()))
    for label, bound in bounds.items():
        print(f"  {label}: " + ", ".join(f"{n} {value:.3f}" for n, value in bound.items()))
    with transaction, transaction.reading(args.information):
        transaction.figure(plot(networks, regressions, args.title, bounds), args.out)
        if args.json:
            transaction.json(args.json, {"networks": networks, "regressions": regressions, "bounds": bounds,
                                         "runs": {**earlier["runs"], **extended, **series}})
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
