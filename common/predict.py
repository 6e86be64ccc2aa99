"""The one prediction driver: a trained run applied to new files, each output written once, atomically, into a
folder of the suite's own.

    python -m <app>.predict --run-dir RUN --input PATH [PATH ...] --out OUT [--force] [application options]

An application's ``predict`` module holds the science as a :class:`~common.application.Predictor`, part of its
declaration (``prediction``): which files it takes (checked before any work: a one-line error naming the file),
the names it writes for each, and how one input becomes them (reading through the engine's ordered walk,
:func:`common.loop.epochs.evaluation_walk`).  Everything else is here:

- the inputs: files, or folders of them (the application's patterns), in name order; two inputs whose outputs
  would share a name are refused;
- the run: ``config.yaml`` and ``model.keras`` (:func:`common.evaluate.load_run`); its normalisation statistics
  and target ranges, never the new data's;
- the output folder: absent, empty, or one this command made (its marker, kind ``predictions``); a folder of
  the user's, a training run or any other kind is refused.  It and every name are checked before TensorFlow
  loads (absent, or the suite's, or ``--force``), and claimed (marked, locked for the command's life: a second
  ``predict`` into it is refused) only once the network has loaded and the predictor's ``prepare`` has run,
  so that a refusal up to there leaves it as it was;
- the ranks (horovodrun, srun, mpirun): input ``i`` goes to rank ``i % ranks``, each rank writes its inputs'
  files, rank 0 the index ``predictions.json`` (inputs, outputs, the model's sha256, the config, the suite's
  version) once every rank is done.  A rank's failure fails the command (exit non-zero), never a partial index.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import pathlib
import sys

from common import distributed, evaluate, registry
from common.application import Predictor
from common.cli import exit_process, run_command
from common.config import load_config
from common.deferred import tensorflow as tf   # at the first prediction, after every check
from common.errors import DataError, UserInputError, data_error_from_pipeline
from common.storage import outputs
from common.storage.outputs import sha256_of
from common.storage.sample_files import list_inputs
from common.storage.transaction import OutputTransaction, Producer

INDEX = "predictions.json"


@dataclasses.dataclass(frozen=True)
class Input:
    """One input file and what the application read of it while checking it (its ``inspect`` result)."""

    path: pathlib.Path
    info: object


def suite_version() -> str:
    """The installed suite's version ('unknown' for a checkout run without installing it)."""
    try:
        return importlib.metadata.version(outputs.SUITE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def output_names(predictor: Predictor, cfg, inputs: list[Input]) -> dict[pathlib.Path, tuple[str, ...]]:
    """Each input's output names, checked to be distinct over all inputs and from the index."""
    names: dict[pathlib.Path, tuple[str, ...]] = {}
    owner: dict[str, pathlib.Path] = {INDEX: pathlib.Path("(the index)")}
    for item in inputs:
        names[item.path] = tuple(predictor.outputs(cfg, item))
        for name in names[item.path]:
            if name in owner:
                raise UserInputError(f"{item.path}: its output {name} would also be {owner[name]}'s; "
                                     "predict them into separate --out folders")
            owner[name] = item.path
    return names


def on_every_rank(dist, check):
    """``check()`` on rank 0, its one-line refusal (a UserInputError) raised on every rank alike; its result
    on rank 0, None elsewhere."""
    problem, result = None, None
    if dist.is_root:
        try:
            result = check()
        except UserInputError as exc:
            problem = str(exc)
    problem = dist.broadcast_object(problem)
    if problem is not None:
        raise UserInputError(problem)
    return result


def producer_of(predictor: Predictor, run_dir: pathlib.Path, inputs) -> Producer:
    """Who writes a prediction: the command, its application, the run and the model applied."""
    return Producer(command=predictor.tool, application=predictor.application, run=str(run_dir.resolve()),
                    model_sha256=sha256_of(run_dir / "model.keras"),
                    data=", ".join(str(pathlib.Path(path).resolve()) for path in inputs[:8])
                    + (f", ... ({len(inputs)} inputs)" if len(inputs) > 8 else ""))


def predict_files(predictor: Predictor, run_dir, paths, out, force: bool = False, options=None,
                  dist: distributed.Distributed | None = None) -> dict:
    """Apply the run in ``run_dir`` to the files ``paths`` (or folders of them), writing into ``out`` as one
    output transaction (:mod:`common.storage.transaction`); the index written by rank 0 (every rank returns it).

    In order: the run's files, the inputs (the one listing), the output folder (its kind and producer) are
    checked, reading only and without TensorFlow; each input is inspected and every output name checked; the
    network is loaded and the predictor's ``prepare`` runs (what every input shares, e.g. a working point from
    the run's validation split); only then is the folder claimed.  Every output is staged and all of them
    committed at the end: a refusal, a failure or a signal at any point leaves the folder as it was."""
    run_dir, out = pathlib.Path(run_dir), pathlib.Path(out)
    evaluate.require_run(run_dir)
    cfg = load_config(predictor.schema, run_dir / "config.yaml")
    options = options if options is not None else argparse.Namespace()
    files = [pathlib.Path(path) for path in list_inputs(paths, predictor.patterns, predictor.what, "--input")]
    dist = dist or distributed.Distributed()
    given = [pathlib.Path(path) for path in paths if pathlib.Path(path).is_dir()]   # folders of inputs: read whole
    transaction = OutputTransaction(producer_of(predictor, run_dir, files), force,
                                    inputs=[run_dir / "model.keras", run_dir / "config.yaml", *files, *given])
    transaction.into(out, "predictions", "--out")
    on_every_rank(dist, transaction.check)   # the folder, before any input is read
    inputs = [Input(path, predictor.inspect(cfg, path)) for path in files]
    names = [name for written in output_names(predictor, cfg, inputs).values() for name in written] + [INDEX]
    transaction.plan(names)
    on_every_rank(dist, lambda: transaction.check(names))
    cfg, model = evaluate.load_run(run_dir, predictor.schema, layers_module=predictor.layers_module)
    if predictor.prepare is not None:
        predictor.prepare(cfg, model, options)
    staging = on_every_rank(dist, lambda: (transaction.claim(), transaction.staging_folder)[1])
    staging = dist.broadcast_object(staging)
    if not dist.is_root:
        transaction.follow(staging)
    writer = PredictionWriter(transaction, provenance_attributes(run_dir, predictor.tool, transaction.producer))
    try:
        rows = []
        for item in inputs[dist.rank::dist.size]:
            with transaction.reading(item.path):
                rows.append(predict_one(predictor, writer, cfg, model, item, options))
        gathered = dist.allgather_object(rows)   # every rank's outputs staged: rank 0 commits them all
        index = {
            "run_dir": writer.attributes["run_dir"], "model_sha256": writer.attributes["model_sha256"],
            "suite_version": writer.attributes["suite_version"], "application": predictor.application,
            "ranks": dist.size,
            "inputs": sorted((row for rank_rows in gathered for row in rank_rows), key=lambda row: row["input"]),
        }
        if dist.is_root:
            with transaction.reading("the index of every input"):
                transaction.json(INDEX, index)
        transaction.commit()
    except BaseException:
        transaction.rollback()   # (under several ranks, the launcher ends the others, whose files go with rank 0's)
        raise
    return index


def predict_one(predictor: Predictor, writer, cfg, model, item: Input, options) -> dict:
    """One input's prediction; a read error TensorFlow raised while reading it is a DataError naming it."""
    try:
        return predictor.predict(writer, cfg, model, item, options)
    except tf.errors.OpError as exc:   # (the network is loaded: TensorFlow is already imported)
        found = data_error_from_pipeline(exc)
        if found is not None:
            raise found from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{item.path}: cannot be read ({type(exc).__name__}: {first[:300]})") from None


class PredictionWriter:
    """What one input's prediction writes: each output staged in the command's transaction (committed with the
    others at the end), its numbers checked, its provenance (:func:`provenance_attributes`) carried by every
    JSON, HDF5 and netCDF file."""

    def __init__(self, transaction: OutputTransaction, attributes: dict[str, str]):
        self.transaction = transaction
        self.attributes = attributes   # the run applied: what every file's provenance says

    def provenance(self) -> dict[str, str]:
        """The global attributes every predicted file carries, a copy."""
        return dict(self.attributes)

    def path(self, name: str, suffix: str = ""):
        """A temporary path to write ``name`` to (staged when the block ends without error)."""
        return self.transaction.path(name, suffix=suffix)

    def json(self, name: str, payload: dict) -> None:
        provenance = {key: value for key, value in self.attributes.items()
                      if key in ("model_sha256", "run_dir", "suite_version")}
        self.transaction.json(name, {**payload, "provenance": provenance})

    def figure(self, figure, name: str, dpi: int = 110) -> None:
        self.transaction.figure(figure, name, dpi=dpi)

    def csv(self, name: str, header: list[str], rows) -> None:
        self.transaction.csv(name, header, rows)


def provenance_attributes(run_dir, tool: str, producer: Producer | None = None) -> dict[str, str]:
    """The global attributes every predicted file carries: what wrote it, from which model and config."""
    run_dir = pathlib.Path(run_dir)
    sha256 = producer.model_sha256 if producer is not None else sha256_of(run_dir / "model.keras")
    return {outputs.WRITTEN_BY: outputs.provenance(tool), "model_sha256": sha256,
            "suite_version": suite_version(), "run_dir": str(run_dir.resolve()),
            "config": (run_dir / "config.yaml").read_text()}


class _Recorded:
    """What an application's ``add_options`` adds to the parser (or a group of it), recorded as it is added."""

    def __init__(self, parser, actions: list):
        self._parser, self._actions = parser, actions

    def add_argument(self, *args, **kwargs):
        action = self._parser.add_argument(*args, **kwargs)
        self._actions.append(action)
        return action

    def add_mutually_exclusive_group(self, **kwargs):
        return _Recorded(self._parser.add_mutually_exclusive_group(**kwargs), self._actions)

    def add_argument_group(self, *args, **kwargs):
        return _Recorded(self._parser.add_argument_group(*args, **kwargs), self._actions)


def build_parser(package: str, description: str = "") -> tuple[argparse.ArgumentParser, dict]:
    """``python -m <package>.predict``'s command line, and each application option's (owner, dest, default)."""
    predictions = [application.prediction for application in registry.applications(package)]
    known = predictions[0] if len(predictions) == 1 else None   # else the run's config chooses the task
    parser = argparse.ArgumentParser(prog=f"python -m {package}.predict",
                                     description=description or (known.description if known else ""))
    parser.add_argument("--run-dir", required=True, help="a training run directory (holds model.keras, config.yaml)")
    parser.add_argument("--input", required=True, nargs="+", metavar="PATH",
                        help="files to predict on, or folders of them"
                             + (f" ({known.what}: {', '.join(known.patterns)})" if known else ""))
    parser.add_argument("--out", required=True, help="the folder to write into: new, empty, or one this command "
                                                     "wrote with the same run and model (its outputs replaced)")
    parser.add_argument("--force", action="store_true",
                        help="replace files of the names it writes that this suite did not write")
    options_of = {}   # option -> (the application that declares it, its dest, its default)
    for application in registry.applications(package):
        prediction = application.prediction
        if prediction is not None and prediction.add_options is not None:
            added: list = []
            prediction.add_options(_Recorded(parser, added))
            for action in added:
                options_of[action.option_strings[0]] = (application.name, action.dest, action.default)
    return parser, options_of


def run_predict(package: str, argv=None, description: str = "") -> int:
    """``python -m <package>.predict``: the run's application applied to new files; the report printed."""
    parser, options_of = build_parser(package, description)
    args = parser.parse_args(argv)
    predictor = predictor_of(package, args.run_dir)
    if predictor is None:
        raise UserInputError(f"{package} declares no prediction")
    refuse_foreign_options(package, args, predictor, options_of)
    dist = distributed.init() if distributed.launched_world_size() > 1 else None
    try:
        index = predict_files(predictor, args.run_dir, args.input, args.out, args.force, args, dist)
    except Exception as exc:
        if dist is not None and not isinstance(exc, UserInputError):   # which rank failed, for the launcher's log
            print(f"error: rank {dist.rank} of {dist.size}: predict failed", file=sys.stderr, flush=True)
        raise
    if dist is None or dist.is_root:
        for line in predictor.report(index):
            print(line)
        print(f"wrote {pathlib.Path(args.out) / INDEX}", flush=True)
    return 0


def main(package: str, description: str = ""):
    """The ``__main__`` of ``<package>.predict``: :func:`run_predict` through the one way in."""
    exit_process(run_command(lambda argv: run_predict(package, argv, description), name=f"{package}.predict"))


def refuse_foreign_options(package: str, args, predictor: Predictor, options_of: dict) -> None:
    """A :class:`UserInputError` naming an option given that belongs to another task's prediction than the
    run's (``--probabilities`` on a detection run would otherwise be ignored without a word)."""
    own = {application.name for application in registry.applications(package)
           if application.prediction is predictor}
    for option, (owner, dest, default) in options_of.items():
        if owner not in own and getattr(args, dest, default) != default:
            raise UserInputError(f"{option}: an option of {owner} prediction; the run at {args.run_dir} "
                                 f"is {', '.join(sorted(own))}")


def predictor_of(package: str, run_dir) -> Predictor | None:
    """The prediction of the application of ``package`` that trained ``run_dir`` (its config chooses the task)."""
    predictions = [application.prediction for application in registry.applications(package)]
    if len(predictions) == 1:
        return predictions[0]
    return evaluate.application_of(package, run_dir).prediction
