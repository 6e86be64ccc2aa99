"""Node-local staging (``data.stage_dir``): each rank's share of the training files copied, inflated or rewritten
into a rank folder of its own (:func:`stage_files`), reused on the next run only while source, copy and bytes are
the ones recorded in the folder's manifest, and locked for the life of the process that reads the copies."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import gzip
import json
import logging
import os
import pathlib
import re
import socket
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import google_crc32c

from common.errors import ConfigError, DataError
from common.storage.outputs import atomic_path, write_json

log = logging.getLogger(__name__)

ENVIRONMENT_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand_stage_dir(stage_dir: str) -> str:
    """``data.stage_dir`` with each ``$NAME`` or ``${NAME}`` replaced by that environment variable's value, on the
    node that stages (``/dev/shm/cosmoflow-${SLURM_JOB_ID}``: a folder per job); an unset one is a ConfigError
    naming the key."""
    def value_of(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in os.environ:
            raise ConfigError(f"data.stage_dir: {stage_dir} names the environment variable ${name}, which is not set "
                              "here; set it, or set data.stage_dir to a path without it (--set data.stage_dir=...)")
        return os.environ[name]

    return ENVIRONMENT_VARIABLE.sub(value_of, stage_dir)


STAGE_MANIFEST = ".hpc-dl-suite-staged.json"
STAGE_LOCK = ".hpc-dl-suite-staged.lock"
COPY_CHUNK_BYTES = 8 << 20
# The folders stage_files makes in data.stage_dir: one per rank (per rank of each instance with
# distributed.instances, whose ranks share a node's stage_dir).
RANK_FOLDER = re.compile(r"(instance-\d+-)?rank-\d+")
# Rank folders whose staging lock this process holds (resolved path -> descriptor), until it ends.
_held_stage_locks: dict[str, int] = {}


def source_identity(path: str) -> dict:
    """What tells a source file apart from another one of the same name and size: its resolved path,
    device, inode, size and modification time (a rewritten or replaced file changes one of them)."""
    stat = os.stat(path)
    return {"source": str(pathlib.Path(path).resolve()), "device": stat.st_dev, "inode": stat.st_ino,
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def copy_identity(path) -> dict:
    """What tells a staged copy apart from a file put in its place since: device, inode, size, modification
    and change times (a rewrite, a replacement or a touch changes one of them; no one sets the change time)."""
    stat = os.stat(path)
    return {"device": stat.st_dev, "inode": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "ctime_ns": stat.st_ctime_ns}


def crc32c_of(path) -> int:
    """The CRC-32C of a file's bytes (read 1 MiB at a time, which stays in cache: 1.5x faster than 8 MiB)."""
    crc = 0
    with open(path, "rb", buffering=0) as reader:
        while chunk := reader.read(1 << 20):
            crc = google_crc32c.extend(crc, chunk)
    return crc


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


def check_stage_dir(stage_dir: pathlib.Path, data_folders) -> None:
    """Refuse, before anything is written, a stage folder that is a data folder, lies inside one or holds one
    (links followed: the copies would join the dataset, and any ``subset`` or ``manifest`` of it), or that holds
    anything but the suite's rank folders (a user's folder)."""
    resolved = stage_dir.resolve()
    for folder in {pathlib.Path(folder).resolve() for folder in data_folders}:
        relation = ("is" if resolved == folder else "lies inside" if folder in resolved.parents
                    else "holds" if resolved in folder.parents else None)
        if relation:
            via = f" (it resolves to {resolved})" if resolved != stage_dir.absolute() else ""
            raise DataError(f"{stage_dir}: data.stage_dir {relation} the data folder {folder}{via}; the staged "
                            "copies would mix with the dataset: choose a folder outside it (node-local storage)")
    if not stage_dir.exists():
        return
    if not stage_dir.is_dir():
        raise DataError(f"{stage_dir}: data.stage_dir is a file, not a folder")
    foreign = [entry.name + ("/" if entry.is_dir() else "") for entry in sorted(stage_dir.iterdir())
               if entry.is_symlink() or not entry.is_dir() or not RANK_FOLDER.fullmatch(entry.name)]
    if foreign:
        raise DataError(f"{stage_dir}: data.stage_dir holds files this suite did not stage ({len(foreign)}: "
                        f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); choose an absent or "
                        "empty folder, or one this suite staged into")


def _lock_holder() -> dict:
    """Who holds a staging lock, as its lock file says (what a refused job names)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    command = f"python -m {argv[2]}" if len(argv) > 2 and argv[1] == "-m" else pathlib.Path(sys.argv[0]).name
    return {"command": command or "python", "pid": os.getpid(), "host": socket.gethostname(),
            "job": os.environ.get("SLURM_JOB_ID"), "since": datetime.datetime.now().isoformat(timespec="seconds")}


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        job = f", SLURM job {holder['job']}" if holder.get("job") else ""
        return f"{holder['command']} (pid {holder['pid']} on {holder['host']}{job}, since {holder['since']})"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "another process"


def hold_stage_lock(folder: pathlib.Path) -> None:
    """Take ``folder``'s staging lock (an exclusive ``flock`` on :data:`STAGE_LOCK` in it) and hold it until
    this process ends, for as long as it may read the copies there; a killed process releases it.

    Held by another process (a second job staging into the same data.stage_dir): a DataError naming the
    holder, before anything in the folder is read or replaced.  A file system without ``flock``: a warning.
    """
    key = str(folder.resolve())
    path = folder / STAGE_LOCK
    if key in _held_stage_locks:   # staged by this process already: its lock, its copies (unless since removed)
        held = os.fstat(_held_stage_locks[key])
        with contextlib.suppress(OSError):
            if os.path.samestat(held, os.stat(path, follow_symlinks=False)):
                return
        os.close(_held_stage_locks.pop(key))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise DataError(f"{path}: cannot open the staging lock ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        for _ in range(20):   # the holder writes its name just after it takes the lock
            holder = _describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            if holder != "another process":
                break
            time.sleep(0.05)
        os.close(fd)
        raise DataError(f"{folder}: staged copies in use by {holder}; staging here would replace them under it: "
                        "wait for it to end, or give each job a data.stage_dir of its own (e.g. one under "
                        "${SLURM_JOB_ID})") from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            os.close(fd)
            raise DataError(f"{path}: cannot lock the staging folder ({exc.strerror})") from None
        log.warning(f"{folder}: this file system has no file locks ({exc.strerror}); a second job staging into "
                    "this data.stage_dir would not be detected")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_lock_holder()).encode(), 0)
    _held_stage_locks[key] = fd


def _failed_write_hint(exc: OSError) -> str:
    """What to do about a write into the stage folder that failed (a full disk, a quota, a file size limit)."""
    return {errno.ENOSPC: "free space there, or choose another data.stage_dir",
            errno.EDQUOT: "the disk quota there is used up: choose another data.stage_dir",
            errno.EFBIG: "the file size limit (ulimit -f) or the file system's is below this file's size"
            }.get(exc.errno, "choose another data.stage_dir")


def _write_manifest(path: pathlib.Path, staged: dict) -> None:
    try:
        write_json(path, {"files": staged}, "common.storage.staging", force=True)
    except OSError as exc:
        raise DataError(f"{path}: the staging manifest could not be written ({exc.strerror or exc}); "
                        f"{_failed_write_hint(exc)}") from None


def staged_entries(target: pathlib.Path) -> dict[str, dict]:
    """What the manifest of the rank folder ``target`` lists (nothing when it has none); a DataError when the
    folder holds files the manifest does not list (a .partial file: a killed copy).

    The folder is listed before the manifest is read: a name is in the manifest before its copy exists, and
    the manifest only grows, so a job staging there meanwhile is never mistaken for a user's files.
    """
    entries = [p.name for p in target.iterdir()]
    staged: dict[str, dict] = {}
    manifest_path = target / STAGE_MANIFEST
    if manifest_path.is_file():
        try:
            staged = json.loads(manifest_path.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            raise DataError(f"{manifest_path}: not a readable staging manifest; choose another data.stage_dir "
                            "or empty it") from None
    foreign = sorted(name for name in entries if name not in (STAGE_MANIFEST, STAGE_LOCK) and name not in staged
                     and not (name.startswith(".") and name.endswith(".partial")))
    if foreign:
        raise DataError(f"{target}: data.stage_dir holds files this suite did not stage ({len(foreign)}: "
                        f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); choose another "
                        "data.stage_dir or empty it")
    return staged


def remove_killed_copies(target: pathlib.Path, names) -> int:
    """Remove the temporary files (:func:`common.storage.outputs.atomic_path`'s ``.<name>.<random>.partial``)
    that a staging killed while writing left in the rank folder ``target``, of the ``names`` it stages or its
    manifest lists: only while holding the folder's lock (:func:`hold_stage_lock`), so no copy is being written
    there.  Any other file is left alone.  How many were removed (a warning says so)."""
    pattern = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.partial")
    removed = 0
    for entry in target.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and match["name"] in names and entry.is_file() and not entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed += 1
    if removed:
        log.warning(f"{target}: removed {removed} partial cop{'y' if removed == 1 else 'ies'} left by a staging "
                    "that ended while writing (killed)")
    return removed


def stage_files(files: list[str], stage_dir: str, dist, decompress: bool = False,
                staged_format: StagedFormat | None = None, data_dir: str | None = None) -> list[str]:
    """Copy this rank's share of ``files`` to ``stage_dir/rank-<r>`` (parallel copies); with ``decompress``,
    write each GZIP file inflated instead (what a reader then reads without a decompression step); with
    ``staged_format``, write each in that layout (:class:`StagedFormat`).  ``dist``: the ranks, a
    :class:`common.distributed.Distributed` (its rank, size and instance; not imported here: distributed.py
    writes through storage, so storage names it only).

    ``stage_dir`` may name environment variables (``/dev/shm/cosmoflow-${SLURM_JOB_ID}``: a folder per job;
    an unset one is a one-line error).  It is refused when it is, holds or lies inside ``data_dir`` or a
    folder of ``files`` (links followed), or holds anything but rank folders (:func:`check_stage_dir`).
    Each process holds its rank folder's lock for the rest of its life (:func:`hold_stage_lock`): a second
    job staging into the same folder is refused while the first reads the copies.

    Staged files keep a fixed rank assignment (rank r takes files r, r+size,
    ...).  A staged copy is reused only when its source is the same file as
    when it was staged (:func:`source_identity`: path, inode, size, mtime), it
    was staged the same way (copied or inflated), and the copy is the one
    written then (:func:`copy_identity`) with the bytes written then (its
    CRC-32C, read again); otherwise it is staged again.  The manifest records
    each copy's source identity, the way, the copy's identity and CRC-32C.
    A folder holding files the manifest does not list is refused, and only
    listed files are ever replaced; the partial copies a killed staging left
    are removed (:func:`remove_killed_copies`).  A write that fails (a full disk, a file
    size limit) is a one-line error naming the file and the folder.
    """
    root = pathlib.Path(expand_stage_dir(stage_dir))
    check_stage_dir(root, [*([data_dir] if data_dir else []), *{os.path.dirname(os.path.abspath(f)) for f in files}])
    if len(files) < dist.size:   # the same verdict on every rank: each stops with the one line, none waits
        raise DataError(f"{root}: {len(files)} training file(s) for {dist.size} ranks: staging gives each rank whole "
                        "files and a rank would stage none; stage at least one file per rank, or train without "
                        "data.stage_dir (the ranks then share the files' samples)")
    mine = files[dist.rank::dist.size]
    # Instances (distributed.instances) share a node's stage_dir: each rank of each instance has its own folder.
    mine_name = (f"rank-{dist.rank}" if getattr(dist, "instances", 1) == 1
                 else f"instance-{dist.instance_index}-rank-{dist.rank}")
    target = root / mine_name
    manifest_path = target / STAGE_MANIFEST
    names = [staged_name(source, decompress, staged_format) for source in mine]
    if len(set(names)) != len(names):
        raise DataError(f"{root}: two training files of rank {dist.rank} share a name; staging needs unique names")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{target}: data.stage_dir cannot be created ({exc.strerror})") from None
    staged_entries(target)   # a user's folder is refused before the lock file is made in it
    hold_stage_lock(target)
    staged = staged_entries(target)   # again, now that no other process can stage here
    remove_killed_copies(target, {*staged, *names, STAGE_MANIFEST})
    identities = {name: source_identity(source) for name, source in zip(names, mine)}
    format_name = staged_format.name if staged_format else None
    write = staged_format.write if staged_format else gunzip_with_crc32c if decompress else copy_with_crc32c

    def reusable(name: str) -> bool:
        """Whether the copy staged as ``name`` is of this source, staged this way, and still the bytes written."""
        entry = staged.get(name)
        if not isinstance(entry, dict) or entry.get("crc32c") is None or not isinstance(entry.get("copy"), dict):
            return False   # not staged, not finished, or staged by a version of the suite that recorded less
        recorded = {k: entry.get(k) for k in identities[name]}
        if (recorded != identities[name] or bool(entry.get("decompressed")) != decompress
                or entry.get("format") != format_name):
            return False
        copy = target / name
        try:
            if copy_identity(copy) == entry["copy"] and crc32c_of(copy) == entry["crc32c"]:
                return True
        except OSError:
            pass
        log.warning(f"{copy}: not the copy this suite staged there (changed or replaced since); staging it again")
        return False

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(mine)))) as pool:
        fresh = {name for name, reuse in zip(names, pool.map(reusable, names)) if not reuse}
    checked_s = time.perf_counter() - started
    # Listed before copied (a killed copy leaves a listed, unfinished name, which the next run re-copies).
    staged.update({name: {**identities[name], "decompressed": decompress, "format": format_name, "crc32c": None,
                          "copy": None} for name in fresh})
    _write_manifest(manifest_path, staged)

    def copy(source: str) -> tuple[str, str, int | None]:
        name = staged_name(source, decompress, staged_format)
        destination = target / name
        crc = None
        if name in fresh:
            try:
                with atomic_path(destination, force=True) as temporary:   # listed in the manifest: ours
                    crc = write(source, temporary)
            except OSError as exc:   # the partial copy is gone with its temporary file
                raise DataError(f"{source}: could not be staged to {target} ({exc.strerror or exc}); "
                                f"{_failed_write_hint(exc)}; the partial copy was removed") from None
        return name, str(destination), crc

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(mine)))) as pool:
        copies = [pool.submit(copy, source) for source in mine]
        try:
            done = [future.result() for future in copies]
        except BaseException:
            for future in copies:   # the first failure ends the staging: start no more copies
                future.cancel()
            raise
    for name, path, crc in done:
        if crc is not None:
            staged[name].update(crc32c=crc, copy=copy_identity(path))
    reused = [name for name in names if name not in fresh]
    checked = (f" (their CRC-32C read again: {sum(staged[n]['copy']['size'] for n in reused) / 1e6:,.1f} MB in "
               f"{checked_s:.2f} s)" if reused else "")
    if fresh:
        _write_manifest(manifest_path, staged)
        how = f"as {format_name}" if format_name else "inflated" if decompress else "copied"
        log.info(f"staged {len(fresh)} of {len(mine)} file(s) to {target} ({how}); {len(reused)} reused{checked}")
    elif reused:
        log.info(f"reused the {len(reused)} file(s) staged in {target}{checked}")
    return [path for _, path, _ in done]
