"""Data tools for a dataset folder in an application's published layout: a small reproducible subset to try
things on, a sha256 manifest written once, and a parallel verification of a download against it (with every
GZIP stream inflated, so a corrupt or truncated member is named even without a manifest).

Run through the application's data module, which knows which files hold samples::

    python -m cosmoflow.data         subset --from DIR --to DIR --n N [--seed S]
    python -m climate_seg.cam5.data  manifest --from DIR --out FILE
    python -m hep_cnn.data           verify --from DIR [--manifest FILE] [--workers K]

``subset`` keeps the layout: in every folder that holds sample files, ``--n`` of them (drawn with ``--seed``
from the sorted names, so the same call gives the same subset), every other file (statistics, README,
normalisation files) copied as it is.  Where one file holds many samples (HEP's chunks), ``--n`` samples per
folder are drawn the same way and written as HDF5 files of the same datasets and attributes, each dataset
whose first axis counts the file's samples cut to the drawn rows.  The target must be absent or an empty
folder (filled through a work folder renamed at the end), and neither inside the source nor holding it: the
source folder is only ever read.

``manifest`` writes ``sha256sum``-compatible lines (``<hex>  <path relative to the folder>``), sorted, to a
new file outside the folder (an existing one is refused: a manifest is written once).  ``verify`` re-reads
every file in parallel threads with a progress bar; files that differ from the manifest, files it lists
that are missing, and GZIP files that do not inflate to their end are each named on one line; any of them
is exit 2.  Files the manifest does not list are reported, not failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import hashlib
import os
import pathlib
import shutil
import sys
import zlib

import numpy as np

from common.errors import EXIT_BAD_INPUT, UserInputError

CHUNK_BYTES = 4 << 20
GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which files of a dataset folder hold samples: ``patterns`` but not ``exclude`` (fnmatch on the file
    name); with ``rows_per_file``, each such file is HDF5 holding many samples along the first axis of its
    datasets, counted by the first of ``count_datasets`` it has."""

    name: str
    patterns: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    rows_per_file: bool = False
    count_datasets: tuple[str, ...] = ()

    def is_sample(self, path: pathlib.Path) -> bool:
        return any(fnmatch.fnmatch(path.name, pattern) for pattern in self.patterns) and \
            not any(fnmatch.fnmatch(path.name, pattern) for pattern in self.exclude)


def _files(folder: pathlib.Path) -> list[pathlib.Path]:
    """Every regular file under ``folder``, sorted by relative path (links are not followed)."""
    found = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


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


# -- subset -------------------------------------------------------------------------------------------

def subset(layout: Layout, source, target, n: int, seed: int = 0) -> dict:
    """Write the subset of ``source`` into ``target`` (see the module's docstring); what was written."""
    # deferred: h5py and the folder writer only for the subset
    from common.storage.outputs import generated_folder

    source, target = _source_folder(source), pathlib.Path(target)
    if n < 1:
        raise UserInputError(f"--n {n}: expected a positive number of samples per folder")
    _check_apart(source, target, "--to")
    files = _files(source)
    folders: dict[pathlib.Path, list[pathlib.Path]] = {}
    for path in files:
        if layout.is_sample(path):
            folders.setdefault(path.parent, []).append(path)
    if not folders:
        raise UserInputError(f"{source}: no {layout.name} sample files ({', '.join(layout.patterns)}) found")
    report = {"source": str(source), "target": str(target), "seed": seed, "samples": {}, "copied": []}
    with generated_folder(target, f"a {layout.name} subset") as work:
        for path in files:
            if not layout.is_sample(path):
                _copy(path, work / path.relative_to(source))
                report["copied"].append(path.relative_to(source).as_posix())
        for folder, samples in sorted(folders.items()):
            rng = np.random.default_rng([seed, zlib.crc32(folder.relative_to(source).as_posix().encode())])
            where = folder.relative_to(source).as_posix()
            if layout.rows_per_file:
                report["samples"][where] = _subset_rows(layout, samples, source, work, n, rng)
            else:
                chosen = sorted(rng.permutation(len(samples))[:n])
                for index in chosen:
                    _copy(samples[index], work / samples[index].relative_to(source))
                report["samples"][where] = len(chosen)
    return report


def _copy(source: pathlib.Path, destination: pathlib.Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)


def _subset_rows(layout: Layout, samples: list[pathlib.Path], source: pathlib.Path, work: pathlib.Path, n: int,
                 rng: np.random.Generator) -> int:
    """``n`` rows drawn over the folder's files in order; each file with drawn rows written with them."""
    # deferred: h5py only where a layout keeps many samples per file
    import h5py

    counts = []
    for path in samples:
        with h5py.File(path, "r") as handle:
            found = [name for name in layout.count_datasets if name in handle]
            if not found:
                raise UserInputError(f"{path}: none of the datasets {', '.join(layout.count_datasets)}; expected "
                                     f"the {layout.name} layout")
            counts.append(len(handle[found[0]]))
    starts = np.concatenate([[0], np.cumsum(counts)])
    chosen = np.sort(rng.permutation(int(starts[-1]))[:n])
    for i, path in enumerate(samples):
        rows = chosen[(chosen >= starts[i]) & (chosen < starts[i + 1])] - starts[i]
        if len(rows):
            _write_rows(path, work / path.relative_to(source), rows, counts[i])
    return len(chosen)


def _write_rows(source: pathlib.Path, destination: pathlib.Path, rows: np.ndarray, count: int) -> None:
    # deferred: h5py only where a layout keeps many samples per file
    import h5py

    destination.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(source, "r") as reader, h5py.File(destination, "w") as writer:
        writer.attrs.update(dict(reader.attrs))

        def visit(name, item):
            if isinstance(item, h5py.Group):
                writer.require_group(name).attrs.update(dict(item.attrs))
                return
            data = item[rows] if item.shape and item.shape[0] == count else item[()]
            kwargs = {"compression": item.compression, "compression_opts": item.compression_opts,
                      "shuffle": item.shuffle} if item.compression and item.shape else {}
            copy = writer.create_dataset(name, data=data, dtype=item.dtype, **kwargs)
            copy.attrs.update(dict(item.attrs))

        reader.visititems(visit)


# -- manifest and verify ------------------------------------------------------------------------------

@dataclasses.dataclass
class FileCheck:
    path: str
    sha256: str | None = None
    problem: str | None = None


def check_file(path: pathlib.Path, inflate: bool = True) -> FileCheck:
    """sha256 of ``path``; a GZIP file (by its magic bytes) is also inflated to its end, member by member, so
    that a corrupt member (zlib's CRC-32 and length checks) or a truncated one is the file's problem."""
    digest = hashlib.sha256()
    gzipped, inflater, position, problem = False, None, 0, None   # inflater None: at a member's start
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
                if position == 0:
                    gzipped = inflate and chunk[:2] == GZIP_MAGIC
                data = chunk if gzipped and problem is None else b""
                offset = position
                while data:
                    if inflater is None:
                        if data[:2] != GZIP_MAGIC[: len(data[:2])]:
                            problem = f"bytes that are no GZIP member after the last one, at byte {offset}"
                            break
                        inflater = zlib.decompressobj(wbits=31)
                    try:   # output discarded, at most CHUNK_BYTES of it at a time
                        inflater.decompress(data, CHUNK_BYTES)
                        while inflater.unconsumed_tail and not inflater.eof:
                            inflater.decompress(inflater.unconsumed_tail, CHUNK_BYTES)
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
    return FileCheck(str(path), digest.hexdigest(), problem)


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


def write_manifest(source, out, workers: int = 0, progress: bool = True) -> int:
    """sha256 lines of every file under ``source`` into the new file ``out``; the number of files."""
    # deferred: the atomic writer only for the manifest
    from common.storage.outputs import atomic_path

    source, out = _source_folder(source), pathlib.Path(out)
    _check_apart(source, out, "--out")
    if out.exists() or out.is_symlink():
        raise UserInputError(f"{out}: exists; a manifest is written once (verify against it, or name a new file)")
    paths = _files(source)
    results = check_files(paths, workers or default_workers(), progress)
    bad = [r for r in results if r.problem]
    if bad:
        raise UserInputError("; ".join(f"{r.path}: {r.problem}" for r in bad) + "; no manifest written")
    lines = [f"{r.sha256}  {p.relative_to(source).as_posix()}\n" for p, r in zip(paths, results)]
    with atomic_path(out, suffix=".sha256") as temporary:
        pathlib.Path(temporary).write_text("".join(lines))
    return len(lines)


def read_manifest(path) -> dict[str, str]:
    path = pathlib.Path(path)
    entries = {}
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserInputError(f"{path}: --manifest cannot be read ({exc.strerror})") from None
    for number, line in enumerate(text.splitlines(), 1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name or any(c not in "0123456789abcdef" for c in digest):
            raise UserInputError(f"{path}:{number}: expected '<64 hex digits>  <relative path>' (sha256sum's format)")
        entries[name] = digest
    return entries


def verify(source, manifest=None, workers: int = 0, progress: bool = True) -> tuple[list[str], list[str], int]:
    """(problems, one line each; files present but not listed; files checked)."""
    source = _source_folder(source)
    listed = read_manifest(manifest) if manifest else {}
    present = _files(source)
    names = [p.relative_to(source).as_posix() for p in present]
    results = check_files(present, workers or default_workers(), progress)
    problems = [f"{r.path}: {r.problem}" for r in results if r.problem]
    if manifest:
        for name, result in zip(names, results):
            if name in listed and result.sha256 and result.sha256 != listed[name]:
                problems.append(f"{source / name}: sha256 {result.sha256[:16]}... differs from the manifest's "
                                f"{listed[name][:16]}...")
        problems += [f"{source / name}: listed in {manifest} but missing" for name in sorted(set(listed) - set(names))]
    extra = sorted(set(names) - set(listed)) if manifest else []
    return problems, extra, len(present)


def default_workers() -> int:
    return min(16, os.cpu_count() or 1)


# -- command line -------------------------------------------------------------------------------------

def main(layout: Layout, argv=None, prog: str = "") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    part = commands.add_parser("subset", help="a small reproducible subset in the same layout")
    part.add_argument("--from", dest="source", required=True)
    part.add_argument("--to", dest="target", required=True)
    part.add_argument("--n", type=int, required=True, help="samples per folder")
    part.add_argument("--seed", type=int, default=0)
    make = commands.add_parser("manifest", help="sha256 of every file, written once to a new file")
    make.add_argument("--from", dest="source", required=True)
    make.add_argument("--out", required=True)
    make.add_argument("--workers", type=int, default=0)
    check = commands.add_parser("verify", help="re-read every file: against a manifest, and GZIP streams whole")
    check.add_argument("--from", dest="source", required=True)
    check.add_argument("--manifest")
    check.add_argument("--workers", type=int, default=0)
    for sub in (make, check):
        sub.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "subset":
            report = subset(layout, args.source, args.target, args.n, args.seed)
            per_folder = ", ".join(f"{k or '.'}: {v}" for k, v in report["samples"].items())
            print(f"subset of {report['source']} in {report['target']} (seed {args.seed}): samples {per_folder}; "
                  f"{len(report['copied'])} other file(s) copied")
        elif args.command == "manifest":
            count = write_manifest(args.source, args.out, args.workers, not args.no_progress)
            print(f"{args.out}: sha256 of {count} file(s) under {args.source}")
        else:
            problems, extra, count = verify(args.source, args.manifest, args.workers, not args.no_progress)
            for name in extra:
                print(f"note: {name} is not in the manifest (not checked against it)", file=sys.stderr)
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            if problems:
                print(f"verify: {len(problems)} problem(s) in {count} file(s) under {args.source}", file=sys.stderr)
                return EXIT_BAD_INPUT
            print(f"verify: {count} file(s) under {args.source} read whole"
                  + (f", every one listed in {args.manifest} matching it" if args.manifest else ""))
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
