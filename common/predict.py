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
import contextlib
import csv
import dataclasses
import hashlib
import importlib.metadata
import os
import pathlib
import sys
import traceback

from common import distributed, evaluate, registry
from common.application import Predictor
from common.cli import exit_on_user_error, exit_process
from common.config import load_config
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.deferred import tensorflow as tf   # at the first prediction, after every check
from common.errors import EXIT_FAILURE, DataError, UserInputError, data_error_from_pipeline
from common.storage import outputs

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


def sha256_of(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def expand_inputs(paths, predictor: Predictor) -> list[pathlib.Path]:
    """The files named, folders replaced by their files matching the application's patterns (name order);
    a missing path, an empty folder or a file named twice is a one-line error."""
    found: list[pathlib.Path] = []
    for given in map(pathlib.Path, paths):
        if given.is_dir():
            files = sorted({p for pattern in predictor.patterns for p in given.glob(pattern) if p.is_file()})
            if not files:
                raise UserInputError(f"{given}: no {predictor.what} files ({', '.join(predictor.patterns)}) in it")
            found.extend(files)
        elif given.is_file():
            found.append(given)
        elif given.is_symlink() and not given.exists():
            raise UserInputError(f"{given}: --input is a link to {os.readlink(given)}, which does not exist")
        else:
            raise UserInputError(f"{given}: --input not found" if not given.exists()
                                 else f"{given}: --input is neither a file nor a folder")
    for path in found:
        if not os.access(path, os.R_OK):
            raise UserInputError(f"{path}: --input cannot be read (no read permission)")
    seen: dict[pathlib.Path, pathlib.Path] = {}
    for path in found:
        resolved = path.resolve()
        if resolved in seen:
            raise UserInputError(f"{path}: given twice as --input (also as {seen[resolved]})")
        seen[resolved] = path
    return found


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


def check_output_folder(out: pathlib.Path, names, force: bool, held: bool = False) -> None:
    """``out`` and every name to be written there, checked (reading only): absent, an empty folder, or a folder
    of predict's own; each name absent, the suite's, or ``--force``.  ``held``: this command holds the folder's
    lock (its lock file does not make a new folder one of the user's)."""
    if out.is_symlink() and not out.exists():
        raise UserInputError(f"{out}: --out is a link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{out}: --out is a file, not a folder")
    if out.is_dir() and outputs.run_kind(out) is None \
            and any(entry.name != outputs.RUN_LOCK or not held for entry in out.iterdir()):
        raise UserInputError(f"{out}: holds files this suite did not write ({outputs.folder_summary(out)}); "
                             "predict into a new or empty folder")
    outputs.check_run_kind(out, "predictions", resume=False)
    outputs.check_writable_folder(out, "--out")
    for name in (*names, INDEX):
        outputs.check_replaceable(out / name, force, "pass --force to replace it")


@dataclasses.dataclass
class Claim:
    """The output folder as :func:`claim_output_folder` took it: its lock, and what the claim created (undone
    by :meth:`undo` when the command fails: a failed prediction leaves the folder as it found it)."""

    out: pathlib.Path
    lock: outputs.RunDirLock
    created_folder: bool
    created_marker: bool

    def undo(self) -> None:
        if self.created_marker:
            (self.out / outputs.RUN_MARKER).unlink(missing_ok=True)
            (self.out / outputs.RUN_LOCK).unlink(missing_ok=True)   # ours: made with the marker, still locked
        if self.created_folder:
            with contextlib.suppress(OSError):
                self.out.rmdir()   # only when empty

    def release(self) -> None:
        self.lock.release()


def claim_output_folder(out: pathlib.Path, app: str, tool: str, names, force: bool) -> Claim:
    """The checks again (:func:`check_output_folder`), ``out`` locked (held until the command ends) and checked
    once more under the lock, then marked as a predictions folder listing every name to be written (so each
    rank's writes are the suite's, and the marker is written once, not by every rank); a refusal up to the
    marking leaves the folder as it was (a folder held by another command: its marker's list untouched)."""
    check_output_folder(out, names, force)
    created_folder = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"{out}: --out cannot be created ({exc.strerror})") from None
    lock_file_existed, lock = (out / outputs.RUN_LOCK).exists(), None
    try:
        lock = outputs.RunDirLock(out, tool, option="--out").acquire()
        check_output_folder(out, names, force, held=True)   # again, under the lock: what another did meanwhile
    except BaseException:
        if lock is not None:
            if not lock_file_existed:
                (out / outputs.RUN_LOCK).unlink(missing_ok=True)   # ours, still locked by us
            lock.release()
        if created_folder:
            with contextlib.suppress(OSError):
                out.rmdir()   # only when empty
        raise
    # Marked only now: a refused claim (another command holds the folder) leaves the marker's list as it was.
    created_marker = outputs.read_run_marker(out) is None
    outputs.mark_run_dir(out, app, files=[*names, INDEX], kind="predictions", tool=tool)
    claim = Claim(out, lock, created_folder, created_marker)
    for killed in outputs.remove_killed_writes(out):
        print(f"{tool}: removed {killed}, left by a write that was killed", file=sys.stderr, flush=True)
    return claim


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


def predict_files(predictor: Predictor, run_dir, paths, out, force: bool = False, options=None,
                  dist: distributed.Distributed | None = None) -> dict:
    """Apply the run in ``run_dir`` to the files ``paths`` (or folders of them), writing into ``out``; the index
    written by rank 0 (every rank returns it).

    In order: the run's files, every input (``inspect``) and the output folder are checked (reading only, no
    TensorFlow); the network is loaded and the predictor's ``prepare`` runs (what every input shares, e.g. a
    working point from the run's validation split); only then is the folder claimed, so a refusal at any of
    these steps leaves it as it was."""
    run_dir, out = pathlib.Path(run_dir), pathlib.Path(out)
    evaluate.require_run(run_dir)
    cfg = load_config(predictor.schema, run_dir / "config.yaml")
    options = options if options is not None else argparse.Namespace()
    inputs = [Input(path, predictor.inspect(cfg, path)) for path in expand_inputs(paths, predictor)]
    names = [name for written in output_names(predictor, cfg, inputs).values() for name in written]
    dist = dist or distributed.Distributed()
    on_every_rank(dist, lambda: check_output_folder(out, names, force))
    cfg, model = evaluate.load_run(run_dir, predictor.schema, layers_module=predictor.layers_module)
    if predictor.prepare is not None:
        predictor.prepare(cfg, model, options)
    claim = on_every_rank(dist, lambda: claim_output_folder(out, predictor.application, predictor.tool, names, force))
    attributes = provenance_attributes(run_dir, predictor.tool)   # the model hashed once, for every file
    writer = PredictionWriter(out, predictor.tool, force, attributes)
    try:
        rows = [predict_one(predictor, writer, cfg, model, item, options) for item in inputs[dist.rank::dist.size]]
        gathered = dist.allgather_object(rows)
        index = {
            "run_dir": attributes["run_dir"], "model_sha256": attributes["model_sha256"],
            "suite_version": attributes["suite_version"], "application": predictor.application, "ranks": dist.size,
            "inputs": sorted((row for rank_rows in gathered for row in rank_rows), key=lambda row: row["input"]),
        }
        if dist.is_root:
            outputs.write_json(out / INDEX, index, predictor.tool, force)
    except BaseException:
        # This rank's files of this command go (no index names them: a failed command leaves no partial set
        # behind); rank 0 undoes what its claim created.  (Under several ranks, the launcher ends the others,
        # which may leave theirs.)
        writer.remove_written()
        if claim is not None:
            claim.undo()
        raise
    finally:
        if claim is not None:
            claim.release()
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
    """What one input's prediction writes into the output folder: each name atomically (a temporary file
    beside it, renamed when whole), never over a file the suite did not write unless ``--force``."""

    def __init__(self, out, tool: str, force: bool, attributes: dict[str, str]):
        self.out, self.tool, self.force = pathlib.Path(out), tool, force
        self.attributes = attributes   # the run applied: what every file's provenance says (provenance_attributes)
        self.written: list[pathlib.Path] = []   # by this command, for remove_written

    def remove_written(self) -> None:
        """Remove the files this writer wrote in this command (a failed command's)."""
        for path in self.written:
            path.unlink(missing_ok=True)
        self.written.clear()

    def provenance(self) -> dict[str, str]:
        """The global attributes every predicted file carries (:func:`provenance_attributes`), a copy."""
        return dict(self.attributes)

    @contextlib.contextmanager
    def path(self, name: str, suffix: str = ".partial"):
        """A temporary path to write ``name`` to; it becomes ``name`` when the block ends without error."""
        with outputs.atomic_path(self.out / name, self.force, suffix=suffix) as temporary:
            yield temporary
        self.written.append(self.out / name)

    def json(self, name: str, payload: dict) -> None:
        outputs.write_json(self.out / name, payload, self.tool, self.force)
        self.written.append(self.out / name)

    def figure(self, figure, name: str, dpi: int = 110) -> None:
        """A figure (closed once written), marked as the suite's."""
        try:
            outputs.save_figure(figure, self.out / name, self.tool, self.force, dpi=dpi)
            self.written.append(self.out / name)
        finally:
            plt.close(figure)

    def csv(self, name: str, header: list[str], rows) -> None:
        """A CSV table (the folder's marker lists it: CSV has no room for a mark of its own)."""
        with self.path(name) as temporary, open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)


def provenance_attributes(run_dir, tool: str) -> dict[str, str]:
    """The global attributes every predicted file carries: what wrote it, from which model and config."""
    run_dir = pathlib.Path(run_dir)
    return {outputs.WRITTEN_BY: outputs.provenance(tool), "model_sha256": sha256_of(run_dir / "model.keras"),
            "suite_version": suite_version(), "run_dir": str(run_dir.resolve()),
            "config": (run_dir / "config.yaml").read_text()}


def run_predict(package: str, argv=None, description: str = "") -> int:
    """``python -m <package>.predict``: the run's application applied to new files; the report printed."""
    with exit_on_user_error():
        predictions = [application.prediction for application in registry.applications(package)]
    known = predictions[0] if len(predictions) == 1 else None   # else the run's config chooses the task
    parser = argparse.ArgumentParser(prog=f"python -m {package}.predict",
                                     description=description or (known.description if known else ""))
    parser.add_argument("--run-dir", required=True, help="a training run directory (holds model.keras, config.yaml)")
    parser.add_argument("--input", required=True, nargs="+", metavar="PATH",
                        help="files to predict on, or folders of them"
                             + (f" ({known.what}: {', '.join(known.patterns)})" if known else ""))
    parser.add_argument("--out", required=True, help="the folder to write into: new, empty, or one of predict's own")
    parser.add_argument("--force", action="store_true",
                        help="replace files of the names it writes that this suite did not write")
    options_of = {}   # option -> (the application that declares it, its dest, its default)
    for application in registry.applications(package):
        prediction = application.prediction
        if prediction is not None and prediction.add_options is not None:
            before = len(parser._actions)
            prediction.add_options(parser)
            for action in parser._actions[before:]:
                options_of[action.option_strings[0]] = (application.name, action.dest, action.default)
    args = parser.parse_args(argv)
    dist = None
    with exit_on_user_error():
        predictor = known or predictor_of(package, args.run_dir)
        if predictor is None:
            raise UserInputError(f"{package} declares no prediction")
        refuse_foreign_options(package, args, predictor, options_of)
        dist = distributed.init() if distributed.launched_world_size() > 1 else None
        try:
            index = predict_files(predictor, args.run_dir, args.input, args.out, args.force, args, dist)
        except UserInputError:
            raise
        except Exception as exc:   # noqa: BLE001  a failure: its traceback, one line, exit 1 (never a hang)
            traceback.print_exc()
            rank = f"rank {dist.rank} of {dist.size}: " if dist is not None else ""
            print(f"error: {rank}predict failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            exit_process(EXIT_FAILURE)
    if dist is None or dist.is_root:
        for line in predictor.report(index):
            print(line)
        print(f"wrote {pathlib.Path(args.out) / INDEX}", flush=True)
    return 0


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
    return evaluate.application_of(package, run_dir).prediction
