"""Input-pipeline pieces every application uses (the datasets contract is
:class:`common.application.Datasets`): shared-seed file shuffling with rank sharding, and staging to local storage."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import logging
import os
import pathlib
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import google_crc32c
import numpy as np

import tensorflow as tf

from common.distributed import Distributed
from common.errors import DataError
from common.storage.outputs import atomic_path, write_json

log = logging.getLogger(__name__)


def epoch_seed(base_seed: int, epoch: int, salt: int = 0) -> int:
    """The seed of one epoch's shuffles (the same on every rank), within int64."""
    return (base_seed * 1_000_003 + epoch * 7919 + salt) % (1 << 62)


def list_files(directory: str | pathlib.Path, patterns: tuple[str, ...], what: str) -> list[str]:
    """Sorted files in ``directory`` matching any glob pattern; a clear error if none."""
    directory = pathlib.Path(directory)
    try:
        os.stat(directory)
    except FileNotFoundError:
        raise DataError(f"{directory}: {what} directory not found") from None
    except OSError as exc:   # a parent folder that cannot be searched
        raise DataError(f"{directory}: {what} directory cannot be reached ({exc.strerror})") from None
    if not directory.is_dir():
        raise DataError(f"{directory}: {what} directory expected, found a file")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise DataError(f"{directory}: {what} directory cannot be read (permission denied)")
    files = sorted({str(p) for pattern in patterns for p in directory.glob(pattern) if p.is_file()})
    unreadable = [f for f in files if not os.access(f, os.R_OK)]
    if unreadable:
        raise DataError(f"{unreadable[0]}: cannot be read (permission denied)"
                        + (f"; {len(unreadable) - 1} more such files" if len(unreadable) > 1 else ""))
    if not files:
        raise DataError(f"{directory}: no {what} files matching {' or '.join(patterns)}")
    return files


def screen_files(files: list[str], inspect: Callable[[str], int], dist: Distributed, on_bad_file: str,
                 where: str) -> tuple[list[str], dict[str, int], list[str]]:
    """Inspect every file once, each rank a share, and agree on the verdicts over ranks.

    ``inspect(path)`` returns the file's sample count or raises
    :class:`DataError`.  With ``on_bad_file="fail"`` the first problem is
    raised (with the number of others); with ``"skip"`` bad files are left
    out and each is reported once by rank 0.  Returns (good files in order,
    their sample counts, the problems).
    """
    def verdicts(paths):
        out = {}
        for path in paths:
            try:
                out[path] = (inspect(path), None)
            except DataError as exc:
                out[path] = (0, str(exc))
        return out

    merged: dict[str, tuple[int, str | None]] = {}
    for part in dist.allgather_object(verdicts(files[dist.rank::dist.size])):
        merged.update(part)
    # Files no rank reported (a stand-in Distributed that plays one rank of many) are inspected here.
    merged.update(verdicts([f for f in files if f not in merged]))
    problems = [merged[f][1] for f in files if merged[f][1]]
    if problems and on_bad_file == "fail":
        others = f" (and {len(problems) - 1} more bad files: python -m common.tools.check_data lists them, " \
                 "data.on_bad_file: skip leaves them out)" if len(problems) > 1 else ""
        raise DataError(problems[0] + others)
    if problems and dist.is_root:
        for problem in problems:
            log.warning(f"skipping bad file: {problem}")
    good = [f for f in files if not merged[f][1]]
    if not good:
        raise DataError(f"{where}: all {len(files)} files are bad; the first: {problems[0]}")
    return good, {f: merged[f][0] for f in good}, problems


def check_split_files(data_dir, splits: tuple[str, ...], patterns: tuple[str, ...], what: str,
                      check_file: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run ``check_file`` (raises :class:`DataError`) on every file of ``data_dir/<split>``.

    Returns (files checked, every problem found): a data checker reports all
    the bad files at once instead of stopping at the first.
    """
    problems: list[str] = []
    checked = 0
    for split in splits:
        directory = pathlib.Path(data_dir) / split
        try:
            files = list_files(directory, patterns, f"{what} {split}")
        except DataError as exc:
            problems.append(str(exc))
            continue
        for path in files:
            checked += 1
            problem = check_quietly(check_file, path)
            if problem:
                problems.append(problem)
    return checked, problems


def check_quietly(check_file: Callable[[str], object], path: str) -> str | None:
    """``check_file(path)``'s problem as one line, or None: a checker reports every file and never crashes
    (an error of any kind becomes the file's problem)."""
    try:
        check_file(path)
    except DataError as exc:
        return str(exc)
    except Exception as exc:   # noqa: BLE001  a reader library's error: report it against the file
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{path}: cannot be read ({type(exc).__name__}{': ' + detail[:300] if detail else ''})"
    return None


@contextlib.contextmanager
def reading(path, where: str = ""):
    """Errors of a file library (h5py's OSError, a short dataset's ValueError) inside the block become a
    :class:`DataError` naming ``path`` (and ``where``: record, events, crop)."""
    try:
        yield
    except DataError:
        raise
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}{': ' + where if where else ''}: cannot be read ({detail})") from None


def read_at(path: str, offset: int, dtype: str, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``shape`` values of ``dtype`` stored at byte ``offset`` of ``path``, read straight into a new array
    (one copy from the page cache; ``readinto`` releases the GIL while it reads)."""
    out = np.empty(shape, np.dtype(dtype))
    view, done = memoryview(out).cast("B"), 0
    with reading(path, what), open(path, "rb", buffering=0) as handle:
        handle.seek(offset)
        while done < out.nbytes:
            n = handle.readinto(view[done:])
            if not n:
                raise DataError(f"{path}: truncated: {what} at byte offset {offset} needs {out.nbytes} bytes, "
                                f"the file holds {done} of them")
            done += n
    return out


def data_error_from_pipeline(exc: Exception) -> DataError | None:
    """The :class:`DataError` a reader raised inside tf.data (numpy_function), if that is what ``exc`` carries."""
    match = re.search(r"DataError: ([^\n]+)", str(exc))
    return DataError(match.group(1).strip()) if match else None


def select_count(available: int, requested: int | None, key: str, where: str) -> int:
    """Samples to use: all present by default; asking for more than exists is an error."""
    if requested is None:
        return available
    if requested > available:
        raise DataError(f"{key}={requested} but only {available} samples are present in {where}")
    return requested


def steps_for(samples: int, size: int, batch_size: int, key: str, where: str) -> int:
    """Full batches each rank can take from its share of ``samples``."""
    steps = samples // size // batch_size
    if steps < 1:
        raise DataError(f"{where}: {samples} samples cannot fill one batch of {batch_size} on each of "
                        f"{size} ranks (lower {key} or add data)")
    return steps


def shuffled_shards(files: list[str], dist: Distributed, seed, shuffle: bool = True) -> tf.data.Dataset:
    """File names permuted with ``seed`` (shared by all ranks), then sharded by rank.

    Every rank draws the same permutation and keeps every size-th file from
    its rank on, so ranks read disjoint files.  With fewer files than ranks
    the caller must shard records instead (see :func:`shards_files`).
    """
    names = tf.constant(files)
    if shuffle:
        names = tf.random.experimental.stateless_shuffle(names, seed=[seed, 0])
    dataset = tf.data.Dataset.from_tensor_slices(names)
    if shards_files(len(files), dist):
        dataset = dataset.shard(dist.size, dist.rank)
    return dataset


def shards_files(num_files: int, dist: Distributed) -> bool:
    """Shard at the file level when every rank gets at least one file."""
    return num_files >= dist.size


STAGE_MANIFEST = ".hpc-dl-suite-staged.json"
COPY_CHUNK_BYTES = 8 << 20


def source_identity(path: str) -> dict:
    """What tells a source file apart from another one of the same name and size: its resolved path,
    device, inode, size and modification time (a rewritten or replaced file changes one of them)."""
    stat = os.stat(path)
    return {"source": str(pathlib.Path(path).resolve()), "device": stat.st_dev, "inode": stat.st_ino,
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _write_with_crc32c(reader, destination) -> int:
    """Everything ``reader`` yields written to ``destination``; the CRC-32C of the bytes written."""
    crc = 0
    with open(destination, "wb") as writer:
        while chunk := reader.read(COPY_CHUNK_BYTES):
            crc = google_crc32c.extend(crc, chunk)
            writer.write(chunk)
    return crc


def copy_with_crc32c(source: str, destination) -> int:
    """Copy ``source`` to ``destination``; the CRC-32C of the bytes copied (recorded in the manifest)."""
    with open(source, "rb") as reader:
        return _write_with_crc32c(reader, destination)


def gunzip_with_crc32c(source: str, destination) -> int:
    """Write ``source``'s GZIP stream inflated to ``destination``; the CRC-32C of the bytes written.  A corrupt
    or truncated stream is a DataError naming ``source``."""
    try:
        with gzip.open(source, "rb") as reader:
            return _write_with_crc32c(reader, destination)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:   # the stream, not the disk written to
        raise DataError(f"{source}: not a complete GZIP stream ({type(exc).__name__}: {exc}); the file is corrupt "
                        "or truncated (data.compression is gzip)") from None


@dataclasses.dataclass(frozen=True)
class StagedFormat:
    """A layout an application stages its files in (read by a reader of its own): ``name`` (recorded in the
    manifest: a copy staged in another format is staged again), ``suffix`` (added to the staged name) and
    ``write(source, destination) -> CRC-32C of the bytes written`` (a bad source: a DataError naming it)."""

    name: str
    suffix: str
    write: Callable[[str, pathlib.Path], int]


def staged_name(source: str, decompress: bool, staged_format: StagedFormat | None = None) -> str:
    """The staged copy's name: the source's, less ``.gz`` when it is staged inflated, plus the format's suffix."""
    name = pathlib.Path(source).name
    name = name[: -len(".gz")] if (decompress or staged_format) and name.endswith(".gz") else name
    return name + (staged_format.suffix if staged_format else "")


def stage_files(files: list[str], stage_dir: str, dist: Distributed, decompress: bool = False,
                staged_format: StagedFormat | None = None) -> list[str]:
    """Copy this rank's share of ``files`` to ``stage_dir/rank-<r>`` (parallel copies); with ``decompress``,
    write each GZIP file inflated instead (what a reader then reads without a decompression step); with
    ``staged_format``, write each in that layout (:class:`StagedFormat`).

    Staged files keep a fixed rank assignment (rank r takes files r, r+size,
    ...).  A staged copy is reused only when its source is the same file as
    when it was staged (:func:`source_identity`: path, inode, size, mtime), it
    was staged the same way (copied or inflated) and the copy has the recorded
    size; otherwise it is staged again.  The manifest records each copy's
    source identity, the way, its size and CRC-32C.  A folder holding files the
    manifest does not list is refused, and only listed files are ever replaced.
    """
    mine = files[dist.rank::dist.size]
    # Instances (distributed.instances) share a node's stage_dir: each rank of each instance has its own folder.
    mine_name = (f"rank-{dist.rank}" if getattr(dist, "instances", 1) == 1
                 else f"instance-{dist.instance_index}-rank-{dist.rank}")
    target = pathlib.Path(stage_dir) / mine_name
    manifest_path = target / STAGE_MANIFEST
    staged: dict[str, dict] = {}
    if manifest_path.is_file():
        try:
            staged = json.loads(manifest_path.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            raise DataError(f"{manifest_path}: not a readable staging manifest; choose another data.stage_dir "
                            "or empty it") from None
    if target.is_dir():
        foreign = sorted(p.name for p in target.iterdir() if p.name != STAGE_MANIFEST and p.name not in staged
                         and not (p.name.startswith(".") and p.name.endswith(".partial")))  # a killed copy
        if foreign:
            raise DataError(f"{target}: data.stage_dir holds files this suite did not stage ({len(foreign)}: "
                            f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); choose another "
                            "data.stage_dir or empty it")
    names = [staged_name(source, decompress, staged_format) for source in mine]
    if len(set(names)) != len(names):
        raise DataError(f"{stage_dir}: two training files of rank {dist.rank} share a name; staging needs unique names")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{target}: data.stage_dir cannot be created ({exc.strerror})") from None
    identities = {name: source_identity(source) for name, source in zip(names, mine)}
    format_name = staged_format.name if staged_format else None
    write = staged_format.write if staged_format else gunzip_with_crc32c if decompress else copy_with_crc32c

    def current(name: str) -> bool:
        entry = staged.get(name)
        copy = target / name
        if not isinstance(entry, dict) or not copy.is_file():
            return False   # not staged, or by a version of the suite that recorded only the source's path
        recorded = {k: entry.get(k) for k in identities[name]}
        return (recorded == identities[name] and bool(entry.get("decompressed")) == decompress
                and entry.get("format") == format_name and copy.stat().st_size == entry.get("copy_size", entry["size"]))

    fresh = {name for name in names if not current(name)}
    # Listed before copied (a killed copy leaves a listed, unfinished name, which the next run re-copies).
    staged.update({name: {**identities[name], "decompressed": decompress, "format": format_name, "crc32c": None,
                          "copy_size": None} for name in fresh})
    write_json(manifest_path, {"files": staged}, "common.storage.data staging", force=True)

    def copy(source: str) -> tuple[str, str, int | None]:
        name = staged_name(source, decompress, staged_format)
        destination = target / name
        crc = None
        if name in fresh:
            with atomic_path(destination, force=True) as temporary:   # listed in the manifest: ours
                crc = write(source, temporary)
        return name, str(destination), crc

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(mine)))) as pool:
        done = list(pool.map(copy, mine))
    for name, path, crc in done:
        if crc is not None:
            staged[name].update(crc32c=crc, copy_size=os.stat(path).st_size)
    if fresh:
        write_json(manifest_path, {"files": staged}, "common.storage.data staging", force=True)
        how = f"as {format_name}" if format_name else "inflated" if decompress else "copied"
        log.info(f"staged {len(fresh)} of {len(mine)} file(s) to {target} ({how}); {len(mine) - len(fresh)} reused")
    return [path for _, path, _ in done]
