"""Data tools for a dataset folder in an application's published layout: a small reproducible subset to try
things on, a sha256 manifest written once, and a parallel verification of a download against it (with every
GZIP stream inflated, every TFRecord stream walked record by record and every HDF5 file's size checked against
its superblock, so a corrupt or truncated file is named even without a manifest).

Run through the application's data module, which knows which files hold samples::

    python -m cosmoflow.data         subset --from DIR --to DIR --n N [--seed S]
    python -m climate_seg.cam5.data  manifest --from DIR --out FILE
    python -m hep_cnn.data           verify --from DIR [--manifest FILE] [--workers K]

Every tool lists the folder the same way (:func:`list_folder`): every file under it, through symbolic links (a
dataset made of links is read through them; the manifest records the link's path), and every entry that cannot
be read as a file (a dangling link, a folder with a sample's name, a file without read permission, a link loop)
named, never skipped.  ``subset`` and ``manifest`` refuse such a folder, ``verify`` names each entry; a folder
with no files at all is refused by all three (exit 2).

``subset`` keeps the layout: in every folder that holds sample files, ``--n`` of them (drawn with ``--seed``
from the sorted names, so the same call gives the same subset), every other file (statistics, README,
normalisation files) copied as it is.  Where one file holds many samples (HEP's chunks), ``--n`` samples are
drawn the same way and written as HDF5 files of the same datasets and attributes, each dataset whose first axis
counts the file's samples cut to the drawn rows.  Where the splits share a folder (HEP's ``*train*``, ``*val*``,
``*test*`` files: :attr:`DatasetFiles.split_tags`), ``--n`` are drawn from each split, so none is left empty.  An
``--n`` above what a folder (or split) holds is refused, naming it and its count: a subset is never smaller
than asked.  The target must be absent or an empty folder (or a link to one: filled through a work folder
renamed at the end), and neither inside the source nor holding it: the source folder is only ever read.
Everything is checked, and every HEP file's samples counted, before anything is written.

``manifest`` writes ``sha256sum``-compatible lines (``<hex>  <path relative to the folder>``), sorted, to a
new file outside the folder (an existing one is refused: a manifest is written once).  ``verify`` re-reads
every file in parallel threads with a progress bar and names, one line each: files that differ from the
manifest, files it lists that are missing, GZIP files that do not inflate to their end, TFRecord streams
(plain or inflated) with a checksum that does not hold or that do not end where a record ends (cut), HDF5 files
shorter than their superblock says (cut) or without the HDF5 signature, and entries that are no readable files.
``manifest`` refuses any such file.  A manifest that lists a path twice, or a path outside the folder, is
refused.
Against a manifest it says how many files the manifest lists and the folder holds; an empty manifest verifies
nothing and is refused, and sample files the manifest does not list are a problem (counted, the first few
named): a partial manifest says nothing about them, so it cannot call the folder verified.  Other files it does
not list (a README, notes) are noted.  Any problem is exit 2.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os
import pathlib
import posixpath
import shutil
import struct
import sys
import zlib

import google_crc32c
import numpy as np

from common.deferred import h5py   # at first use: only the layouts of many samples per file need it
from common.cli import exit_process, non_negative_int_argument, positive_int_argument, run_command
from common.commands import declared, main_of
from common.errors import EXIT_BAD_INPUT, UserInputError
from common.storage.tfrecord import masked_crc32c   # google-crc32c only, no TensorFlow
from common.storage.generated import generated_folder, is_empty_folder, require_fillable
from common.storage.outputs import folder_summary
from common.storage.transaction import file_transaction, written_file
from common.storage.sample_files import DatasetFiles, bad_entries_message, entry_problem  # noqa: F401  (DatasetFiles: part of this module's interface)

CHUNK_BYTES = 4 << 20
GZIP_MAGIC = b"\x1f\x8b"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_NAMES = (".h5", ".hdf5")   # files that must be HDF5 (a .nc file may be netCDF-3, which is not)
TFRECORD_NAMES = (".tfrecord", ".tfrecords")   # uncompressed files that must be TFRecord streams
NAMED_AT_MOST = 3   # names listed in a one-line message before the rest are counted


@dataclasses.dataclass
class Listing:
    """What a dataset folder holds: ``files`` (regular files, and links to them), sorted by their path relative
    to ``root``; ``bad``: (path, problem) of every entry that cannot be read as a file."""

    root: pathlib.Path
    files: list[pathlib.Path]
    bad: list[tuple[pathlib.Path, str]]

    def relative(self, path: pathlib.Path) -> str:
        return path.relative_to(self.root).as_posix()


def list_folder(folder: pathlib.Path, layout: DatasetFiles | None = None) -> Listing:
    """Every file under ``folder``, through symbolic links to files and to folders (as ``find -L`` does: a
    folder reached by two paths is listed under both; a link back to a folder above it is a loop, named); every
    entry that is no readable file (:func:`common.storage.sample_files.entry_problem`), a folder that cannot be
    read, and a folder that bears a sample file's name under ``layout`` are named in ``bad``."""
    files: list[pathlib.Path] = []
    bad: list[tuple[pathlib.Path, str]] = []
    real_paths: dict[pathlib.Path, str] = {}   # each folder walked: where it really is

    def unreadable(exc: OSError) -> None:
        bad.append((pathlib.Path(exc.filename), f"a folder that cannot be read ({exc.strerror})"))

    for top, folders, names in os.walk(folder, onerror=unreadable, followlinks=True):
        here = pathlib.Path(top)
        real = real_paths[here] = os.path.realpath(here)
        above = here.parents[:len(here.relative_to(folder).parts)]
        if real in {real_paths[parent] for parent in above}:
            bad.append((here, f"a symbolic link to {real}, a folder above it (a loop)"))
            folders[:] = []
            continue
        for name in sorted(folders):
            if layout is not None and layout.is_sample(here / name):
                bad.append((here / name, f"a folder with a {layout.name} sample file's name"))
                folders.remove(name)
        for name in names:
            problem = entry_problem(here / name)
            if problem:
                bad.append((here / name, problem))
            else:
                files.append(here / name)
    listing = Listing(folder, [], [])
    listing.files = sorted(files, key=listing.relative)
    listing.bad = sorted(bad, key=lambda entry: listing.relative(entry[0]))
    return listing


def readable_listing(folder: pathlib.Path, layout: DatasetFiles | None, consequence: str) -> Listing:
    """:func:`list_folder`, refused (one line, ending in ``consequence``) when an entry cannot be read as a file
    or when the folder holds no file at all."""
    listing = list_folder(folder, layout)
    if listing.bad:
        raise UserInputError(bad_entries_message([(str(path), problem) for path, problem in listing.bad])
                             + f"; {consequence}")
    if not listing.files:
        raise UserInputError(f"{folder}: holds no files; {consequence}")
    return listing


def _check_apart(source: pathlib.Path, target: pathlib.Path, what: str) -> None:
    source, target = source.resolve(), target.resolve()
    if target == source or source in target.parents or target in source.parents:
        raise UserInputError(f"{target}: {what} must be outside the source folder {source} (and not hold it); "
                             "the source is only ever read")


def _source_folder(path) -> pathlib.Path:
    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise UserInputError(f"{folder}: --from must be a dataset folder")
    return folder


def _names(names: list[str]) -> str:
    """``a, b, c, ...`` (the first few of ``names``)."""
    return ", ".join(names[:NAMED_AT_MOST]) + (", ..." if len(names) > NAMED_AT_MOST else "")


# -- subset -------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Draw:
    """One folder's (or, with split tags, one split's) samples and the ones drawn: indices into ``samples``,
    or with rows per file, row numbers over the files in order (``rows[i]``: the rows of ``samples[i]``)."""

    where: str
    samples: list[pathlib.Path]
    rows: list[int] | None
    chosen: np.ndarray


def subset(layout: DatasetFiles, source, target, n: int, seed: int = 0) -> dict:
    """Write the subset of ``source`` into ``target`` (see the module's docstring); what was written."""
    source, target = _source_folder(source), pathlib.Path(target)
    if n < 1:
        raise UserInputError(f"--n {n}: expected a positive number of samples per folder")
    _check_apart(source, target, "--to")
    if target.is_dir() and not is_empty_folder(target):   # a finished subset looks like any dataset: never filled
        raise UserInputError(f"{target}: a folder holding {folder_summary(target)} (an earlier subset, or a "
                             "dataset?); a subset is written only into an absent or empty folder: choose a new "
                             "--to; nothing was written")
    require_fillable(target, f"a {layout.name} subset")
    listing = readable_listing(source, layout, "nothing was written")
    groups: dict[tuple[str, str], list[pathlib.Path]] = {}
    for path in listing.files:
        if layout.is_sample(path):
            groups.setdefault((listing.relative(path.parent), layout.split_of(path) or ""), []).append(path)
    if not groups:
        raise UserInputError(f"{source}: no {layout.name} sample files ({', '.join(layout.patterns)}) found")
    draws = [_draw(layout, folder, tag, samples, source, n, seed) for (folder, tag), samples in sorted(groups.items())]
    report = {"source": str(source), "target": str(target), "seed": seed, "samples": {}, "copied": []}
    with generated_folder(target, f"a {layout.name} subset") as work:
        for path in listing.files:
            if not layout.is_sample(path):
                _copy(path, work / listing.relative(path))
                report["copied"].append(listing.relative(path))
        for draw in draws:
            if draw.rows is None:
                for index in draw.chosen:
                    _copy(draw.samples[index], work / listing.relative(draw.samples[index]))
            else:
                starts = np.concatenate([[0], np.cumsum(draw.rows)])
                for i, path in enumerate(draw.samples):
                    rows = draw.chosen[(draw.chosen >= starts[i]) & (draw.chosen < starts[i + 1])] - starts[i]
                    if len(rows):
                        _write_rows(path, work / listing.relative(path), rows, draw.rows[i])
            report["samples"][draw.where] = len(draw.chosen)
    return report


def _draw(layout: DatasetFiles, folder: str, tag: str, samples: list[pathlib.Path], source: pathlib.Path, n: int,
          seed: int) -> Draw:
    """``n`` of the group's samples drawn with ``seed`` (and the group's name: each group its own draw); more
    than the group holds is refused, naming it and its count."""
    where = (f"*{tag}*" if folder == "." else f"{folder}/*{tag}*") if tag else folder
    rng = np.random.default_rng([seed, zlib.crc32(where.encode())])
    rows = [_row_count(layout, path) for path in samples] if layout.rows_per_file else None
    available = sum(rows) if rows is not None else len(samples)
    if n > available:
        place = source / folder if not tag else f"{source / folder} (its *{tag}* files)"
        per = "per folder and split" if layout.split_tags else "per folder"
        raise UserInputError(f"{place}: --n {n}, but it holds {available} {layout.name} sample(s); --n counts "
                             f"samples {per} and a subset is never smaller than asked: ask for at most "
                             f"{available}; nothing was written")
    return Draw(where, samples, rows, np.sort(rng.permutation(available)[:n]))


def _copy(source: pathlib.Path, destination: pathlib.Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)


@contextlib.contextmanager
def _hdf5_errors(path: pathlib.Path, what: str):
    """h5py's errors inside the block (a truncated or damaged file: OSError; a dataset it cannot read: also
    KeyError, ValueError) become one line naming ``path``: ``<path>: <what> (<h5py's first line>)``."""
    try:
        yield
    except UserInputError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"{path}: {what} ({detail})") from None


def _row_count(layout: DatasetFiles, path: pathlib.Path) -> int:
    """The samples one HDF5 file holds: the length of the first of ``layout.count_datasets`` it has."""
    with _hdf5_errors(path, f"not a readable HDF5 file of the {layout.name} layout"), h5py.File(path, "r") as handle:
        found = [name for name in layout.count_datasets if name in handle]
        if not found:
            raise UserInputError(f"{path}: none of the datasets {', '.join(layout.count_datasets)}; expected "
                                 f"the {layout.name} layout")
        return len(handle[found[0]])


def _write_rows(source: pathlib.Path, destination: pathlib.Path, rows: np.ndarray, count: int) -> None:
    """``rows`` of every dataset of ``source`` whose first axis has ``count`` entries (the others whole) into
    the new HDF5 file ``destination``, with the same attributes and compression."""
    unreadable, unwritable = "not a readable HDF5 file", "cannot be written"
    destination.parent.mkdir(parents=True, exist_ok=True)
    with _hdf5_errors(source, unreadable), h5py.File(source, "r") as reader, \
            _hdf5_errors(destination, unwritable), h5py.File(destination, "w") as writer:
        writer.attrs.update(dict(reader.attrs))

        def visit(name, item):
            with _hdf5_errors(source, f"{unreadable}: dataset {name}"):
                attrs = dict(item.attrs)
                if not isinstance(item, h5py.Group):
                    data = item[rows] if item.shape and item.shape[0] == count else item[()]
            with _hdf5_errors(destination, unwritable):
                if isinstance(item, h5py.Group):
                    writer.require_group(name).attrs.update(attrs)
                    return
                kwargs = {"compression": item.compression, "compression_opts": item.compression_opts,
                          "shuffle": item.shuffle} if item.compression and item.shape else {}
                copy = writer.create_dataset(name, data=data, dtype=item.dtype, **kwargs)
                copy.attrs.update(attrs)

        reader.visititems(visit)


# -- manifest and verify ------------------------------------------------------------------------------

@dataclasses.dataclass
class FileCheck:
    path: str
    sha256: str | None = None
    problem: str | None = None


def check_file(path: pathlib.Path, inflate: bool = True) -> FileCheck:
    """sha256 of ``path``; a GZIP file (by its magic bytes) is also inflated to its end, member by member, so
    that a corrupt member (zlib's CRC-32 and length checks) or a truncated one is the file's problem; a TFRecord
    file (by its name, or a first record header whose checksum holds; a GZIP file's inflated stream by the
    latter) is walked record by record (:class:`TFRecordWalk`); an HDF5 file (by its signature, or its name) is
    checked against its superblock (:func:`hdf5_problem`)."""
    digest = hashlib.sha256()
    gzipped, inflater, position, problem, head = False, None, 0, None, b""   # inflater None: at a member's start
    records = None
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
                if position == 0:
                    gzipped, head = inflate and chunk[:2] == GZIP_MAGIC, chunk
                    records = TFRecordWalk(required=not gzipped and pathlib.Path(path).suffix in TFRECORD_NAMES,
                                           stream="inflated stream" if gzipped else "file")
                if not gzipped:
                    records.feed(chunk)
                data = chunk if gzipped and problem is None else b""
                offset = position
                while data:
                    if inflater is None:
                        if data[:2] != GZIP_MAGIC[: len(data[:2])]:
                            problem = f"bytes that are no GZIP member after the last one, at byte {offset}"
                            break
                        inflater = zlib.decompressobj(wbits=31)
                    try:   # at most CHUNK_BYTES of output at a time, walked as a TFRecord stream and dropped
                        records.feed(inflater.decompress(data, CHUNK_BYTES))
                        while inflater.unconsumed_tail and not inflater.eof:
                            records.feed(inflater.decompress(inflater.unconsumed_tail, CHUNK_BYTES))
                    except zlib.error as exc:
                        problem = f"corrupt GZIP member, in bytes {position}-{position + len(chunk)} ({exc})"
                        break
                    if not inflater.eof:
                        break
                    offset += len(data) - len(inflater.unused_data)
                    data, inflater = inflater.unused_data, None
                position += len(chunk)
    except OSError as exc:
        return FileCheck(str(path), problem=f"cannot be read ({exc.strerror or exc})")
    if problem is None and inflater is not None:
        problem = f"truncated GZIP member (the file ends at byte {position}, inside it)"
    if problem is None and records is not None:
        problem = records.finish()
    if problem is None and not gzipped:
        problem = hdf5_problem(head, position, pathlib.Path(path).suffix.lower() in HDF5_NAMES)
    return FileCheck(str(path), digest.hexdigest(), problem)


def _masked(crc: int) -> int:
    """TFRecord's mask of a CRC-32C (as :func:`common.storage.tfrecord.masked_crc32c` applies it)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class TFRecordWalk:
    """A TFRecord stream fed in pieces, walked record by record: each record is an 8-byte little-endian length,
    the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data.  Every checksum must hold
    and the stream must end exactly where a record ends: an uncompressed TFRecord cut in a copy or a download
    (which no other check sees) is named with the record and the byte where it was cut.

    ``required``: the stream must be a TFRecord (its name says so); otherwise it is walked only when its first
    header's checksum holds (one chance in 2**32 for other bytes), and anything else is left alone.
    """

    def __init__(self, required: bool, stream: str = "file"):
        self.required, self.stream = required, stream
        self.active = True   # False once the first header shows it is no TFRecord (and none was required)
        self.record = 0      # records walked whole
        self.start = 0       # where the current record starts
        self.header = b""    # the current record's header, as far as it has come
        self.length = 0
        self.remaining = None   # data bytes of the current record still to come (None: in its header)
        self.crc = 0
        self.footer = b""
        self.problem: str | None = None

    def feed(self, data: bytes) -> None:
        at = 0   # an index into ``data``, not slices of it: a chunk of data bytes is handed to the CRC uncopied
        while at < len(data) and self.active and self.problem is None:
            if self.remaining is None:
                take = 12 - len(self.header)
                self.header += data[at:at + take]
                at += take
                if len(self.header) < 12:
                    return
                self.length, length_crc = struct.unpack("<QI", self.header)
                if masked_crc32c(self.header[:8]) != length_crc:
                    if self.record == 0 and not self.required:
                        self.active = False   # not a TFRecord
                        return
                    self.problem = (f"corrupt TFRecord file: the length checksum of record {self.record} (at byte "
                                    f"{self.start}{self._of()}) does not match")
                    return
                self.remaining, self.crc, self.footer = self.length, 0, b""
            elif self.remaining:
                take = min(self.remaining, len(data) - at)
                self.crc = google_crc32c.extend(self.crc, data if take == len(data) else data[at:at + take])
                self.remaining -= take
                at += take
            else:
                take = 4 - len(self.footer)
                self.footer += data[at:at + take]
                at += take
                if len(self.footer) < 4:
                    return
                if _masked(self.crc) != struct.unpack("<I", self.footer)[0]:
                    self.problem = (f"corrupt TFRecord file: the data checksum of record {self.record} (at byte "
                                    f"{self.start}{self._of()}) does not match")
                    return
                self.record += 1
                self.start += 12 + self.length + 4
                self.header, self.remaining = b"", None

    def finish(self) -> str | None:
        """The stream's problem once it has ended (None: whole, or no TFRecord)."""
        if self.problem or not self.active:
            return self.problem
        if self.remaining is None and not self.header:
            return None   # at a record's end
        if self.remaining is None and self.record == 0 and not self.required:
            return None   # fewer than 12 bytes, not named a TFRecord: nothing says it is one
        if self.remaining is None:
            return (f"truncated TFRecord file: it ends inside the header of record {self.record} (the {self.stream} "
                    f"ends at byte {self.start + len(self.header)}, after {self.record} whole record(s))")
        ends = self.start + 12 + self.length - self.remaining + len(self.footer)
        return (f"truncated TFRecord file: record {self.record} (at byte {self.start}) needs bytes up to "
                f"{self.start + 12 + self.length + 4}, the {self.stream} ends at byte {ends} "
                f"(after {self.record} whole record(s))")

    def _of(self) -> str:
        return " of the inflated stream" if self.stream != "file" else ""


# Where a superblock keeps its "size of offsets" byte and its first address (the base address, followed by one
# other address, then the end-of-file address), by superblock version (the HDF5 file format specification, II.A).
SUPERBLOCK_FIELDS = {0: (13, 24), 1: (13, 28), 2: (9, 12), 3: (9, 12)}


def hdf5_problem(head: bytes, size: int, must_be_hdf5: bool) -> str | None:
    """What the superblock of an HDF5 file says is wrong with it, from its first bytes ``head`` and its
    ``size``: a file shorter than the end-of-file address the superblock records (cut in a copy or a download,
    what the HDF5 library refuses to open as "truncated file"), or a ``must_be_hdf5`` file (named ``.h5``,
    ``.hdf5``) without the signature.  A changed byte inside is found only against a manifest: HDF5 keeps no
    checksum of its data unless written with Fletcher-32."""
    offset = 0   # the signature is at byte 0, or after a user block of 512, 1024, 2048, ... bytes
    while offset + len(HDF5_SIGNATURE) <= len(head) and head[offset:offset + len(HDF5_SIGNATURE)] != HDF5_SIGNATURE:
        offset = 512 if offset == 0 else offset * 2
    if offset + len(HDF5_SIGNATURE) > len(head):
        return (f"no HDF5 signature (at byte 0, or 512, 1024, ... after a user block) in its {size} bytes: not an "
                "HDF5 file, or its start is damaged") if must_be_hdf5 else None
    version = head[offset + 8] if offset + 8 < len(head) else None
    if version not in SUPERBLOCK_FIELDS:
        return None if version is not None else "truncated HDF5 file (it ends inside its superblock)"
    sizes_at, addresses_at = SUPERBLOCK_FIELDS[version]
    if offset + sizes_at >= len(head):
        return "truncated HDF5 file (it ends inside its superblock)"
    width = head[offset + sizes_at]
    if width not in (2, 4, 8, 16, 32):
        return f"a damaged HDF5 superblock (addresses of {width} bytes)"
    end_at = offset + addresses_at + 2 * width
    if end_at + width > len(head):
        return "truncated HDF5 file (it ends inside its superblock)"
    end = int.from_bytes(head[end_at:end_at + width], "little")
    if end != (1 << 8 * width) - 1 and size < end:   # all ones: an undefined address
        return f"truncated HDF5 file: its superblock puts its end at byte {end}, the file ends at byte {size}"
    return None


def check_files(paths: list[pathlib.Path], workers: int, progress: bool) -> list[FileCheck]:
    """:func:`check_file` over ``paths`` in ``workers`` threads (hashlib and zlib release the GIL on large
    buffers), with a progress bar over the bytes read; results in the order of ``paths``."""
    # deferred: tqdm only for the verification's progress bar
    from tqdm import tqdm

    sizes = [p.stat().st_size if p.exists() else 0 for p in paths]
    results: list[FileCheck | None] = [None] * len(paths)
    with tqdm(total=sum(sizes), unit="B", unit_scale=True, disable=not progress, file=sys.stderr,
              desc="checking") as bar, concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {pool.submit(check_file, path): i for i, path in enumerate(paths)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            bar.update(sizes[i])
    return results   # type: ignore[return-value]


def write_manifest(source, out, workers: int = 0, progress: bool = True, layout: DatasetFiles | None = None,
                   command: str = "common.tools.datatools") -> int:
    """sha256 lines of every file under ``source`` into the new file ``out``; the number of files.  Refused
    when an entry cannot be read as a file, a file is corrupt, or there is no file (a manifest of nothing).
    ``command``: the module run (``cosmoflow.data``), what the output transaction says wrote it."""
    source, out = _source_folder(source), pathlib.Path(out)
    _check_apart(source, out, "--out")
    if out.exists() or out.is_symlink():
        raise UserInputError(f"{out}: exists; a manifest is written once (verify against it, or name a new file)")
    file_transaction(out, command, inputs=[source], option="--out")   # before the files are read and hashed
    listing = readable_listing(source, layout, "no manifest written")
    results = check_files(listing.files, workers or default_workers(), progress)
    bad = [r for r in results if r.problem]
    if bad:
        raise UserInputError("; ".join(f"{r.path}: {r.problem}" for r in bad) + "; no manifest written")
    lines = [f"{r.sha256}  {listing.relative(p)}\n" for p, r in zip(listing.files, results)]
    with written_file(out, command, inputs=[source, *listing.files], source=source, option="--out") as temporary:
        pathlib.Path(temporary).write_text("".join(lines))
    return len(lines)


def read_manifest(path) -> dict[str, str]:
    """{path relative to the folder: sha256} of a manifest in sha256sum's format.  Refused (one line naming the
    manifest and the line): a line of another format, an entry that points outside the folder (an absolute
    path, or one that climbs out with ``..``: the folder's own files are what is verified), and a path given
    twice (which of its two digests holds would be a guess)."""
    path = pathlib.Path(path)
    entries: dict[str, str] = {}
    lines: dict[str, int] = {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path}: --manifest cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    for number, line in enumerate(text.splitlines(), 1):
        digest, _, given = line.partition("  ")
        if len(digest) != 64 or not given or any(c not in "0123456789abcdef" for c in digest):
            raise UserInputError(f"{path}:{number}: expected '<64 hex digits>  <relative path>' (sha256sum's format)")
        name = posixpath.normpath(given)
        if posixpath.isabs(name) or name == ".." or name.startswith("../"):
            raise UserInputError(f"{path}:{number}: {given} points outside the folder verified; a manifest lists "
                                 "the folder's files by their paths relative to it")
        if name in lines:
            raise UserInputError(f"{path}:{number}: {given} is listed twice (lines {lines[name]} and {number}); "
                                 "one file has one sha256: remove the wrong line, or write the manifest again")
        entries[name], lines[name] = digest, number
    return entries


@dataclasses.dataclass
class Verdict:
    """What :func:`verify` found: ``problems`` (one line each), ``notes`` (files the manifest does not list
    that hold no samples), ``checked`` (files read whole), ``listed`` (files the manifest lists; None without
    one)."""

    problems: list[str]
    notes: list[str]
    checked: int
    listed: int | None


def verify(source, manifest=None, workers: int = 0, progress: bool = True, layout: DatasetFiles | None = None) -> Verdict:
    """Every file under ``source`` read whole, and compared with ``manifest`` when given (see the module's
    docstring).  ``layout`` tells sample files from others (without it, every file counts as a sample)."""
    source = _source_folder(source)
    listed = read_manifest(manifest) if manifest else None
    if listed is not None and not listed:
        raise UserInputError(f"{manifest}: lists no files; an empty manifest verifies nothing (write one with "
                             "manifest --from DIR --out FILE)")
    listing = list_folder(source, layout)
    if not listing.files and not listing.bad:
        raise UserInputError(f"{source}: holds no files; nothing to verify"
                             + (f" against the {len(listed)} file(s) {manifest} lists" if listed else ""))
    problems = [f"{path}: {problem}" for path, problem in listing.bad]
    results = check_files(listing.files, workers or default_workers(), progress)
    problems += [f"{r.path}: {r.problem}" for r in results if r.problem]
    notes: list[str] = []
    if listed is not None:
        names = [listing.relative(p) for p in listing.files]
        for name, result in zip(names, results):
            if name in listed and result.sha256 and result.sha256 != listed[name]:
                problems.append(f"{source / name}: sha256 {result.sha256[:16]}... differs from the manifest's "
                                f"{listed[name][:16]}...")
        named = set(names) | {listing.relative(path) for path, _ in listing.bad}   # a bad entry is named above
        problems += [f"{source / name}: listed in {manifest} but missing" for name in sorted(set(listed) - named)]
        unlisted = sorted(set(names) - set(listed))
        samples = [name for name in unlisted if layout is None or layout.is_sample(pathlib.Path(name))]
        if samples:
            problems.append(f"{source}: {len(samples)} sample file(s) that {manifest} does not list "
                            f"({_names(samples)}); a partial manifest verifies nothing about them (write a "
                            "manifest of the whole folder)")
        notes = [name for name in unlisted if name not in samples]
    return Verdict(problems, notes, len(listing.files), len(listed) if listed is not None else None)


def default_workers() -> int:
    return min(16, os.cpu_count() or 1)


# -- command line -------------------------------------------------------------------------------------

def build_parser(prog: str = "") -> argparse.ArgumentParser:
    """The data tools' command line (``python -m <app>.data subset|manifest|verify``)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    part = commands.add_parser("subset", help="a small reproducible subset in the same layout")
    part.add_argument("--from", dest="source", required=True)
    part.add_argument("--to", dest="target", required=True)
    part.add_argument("--n", type=positive_int_argument, required=True,
                      help="samples per folder (and per split where splits share a folder)")
    part.add_argument("--seed", type=non_negative_int_argument, default=0)
    make = commands.add_parser("manifest", help="sha256 of every file, written once to a new file")
    make.add_argument("--from", dest="source", required=True)
    make.add_argument("--out", required=True)
    make.add_argument("--workers", type=non_negative_int_argument, default=0, help="threads (0: one per CPU, at most 16)")
    check = commands.add_parser("verify", help="re-read every file: against a manifest, GZIP streams and HDF5 "
                                "files whole")
    check.add_argument("--from", dest="source", required=True)
    check.add_argument("--manifest")
    check.add_argument("--workers", type=non_negative_int_argument, default=0,
                       help="threads (0: one per CPU, at most 16)")
    for sub in (make, check):
        sub.add_argument("--no-progress", action="store_true")
    return parser


def main(layout: DatasetFiles, argv=None, prog: str = "") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        if args.command == "subset":
            report = subset(layout, args.source, args.target, args.n, args.seed)
            per_folder = ", ".join(f"{k}: {v}" for k, v in report["samples"].items())
            print(f"subset of {report['source']} in {report['target']} (seed {args.seed}): samples {per_folder}; "
                  f"{len(report['copied'])} other file(s) copied")
        elif args.command == "manifest":
            count = write_manifest(args.source, args.out, args.workers, not args.no_progress, layout,
                                   command=prog.replace("python -m ", "") or "common.tools.datatools")
            print(f"{args.out}: sha256 of {count} file(s) under {args.source}")
        else:
            return report_verdict(verify(args.source, args.manifest, args.workers, not args.no_progress, layout),
                                  args.source, args.manifest)
    except OSError as exc:   # the disk the subset or manifest is written to (full, gone), said in one line
        print(f"error: {exc.filename or args.source}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def run(layout: DatasetFiles, prog: str, argv=None) -> int:
    """:func:`main` with the program name first (what the command's declaration runs)."""
    return main(layout, argv, prog)


def command_main(module: str) -> None:
    """The ``__main__`` of ``<module>`` (an application's ``<app>.data``): its declared main (the application's
    declaration holds its files' layout) through the one way in."""
    exit_process(run_command(main_of(declared(module)), name=module))


def report_verdict(verdict: Verdict, source: str, manifest: str | None) -> int:
    """Print what :func:`verify` found; its exit code."""
    for name in verdict.notes:
        print(f"note: {name} is not in the manifest (not checked against it)", file=sys.stderr)
    for line in verdict.problems:
        print(f"error: {line}", file=sys.stderr)
    against = f"; {manifest} lists {verdict.listed}" if manifest else ""
    if verdict.problems:
        print(f"verify: {len(verdict.problems)} problem(s); {verdict.checked} file(s) under {source}{against}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    if manifest:
        others = f"; {len(verdict.notes)} other file(s) it does not list (noted above)" if verdict.notes else ""
        print(f"verify: {verdict.checked} file(s) under {source} read whole; {manifest} lists {verdict.listed}, "
              f"each present and matching{others}")
    else:
        print(f"verify: {verdict.checked} file(s) under {source} read whole (GZIP streams inflated, TFRecord "
              "streams walked record by record, HDF5 files "
              "checked against their superblocks; no manifest: contents not compared)")
    return 0
