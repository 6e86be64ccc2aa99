"""The data tools (common/tools/datatools.py) through each application's data module, on files in the published
layouts: CosmoFlow's TFRecords (plain and GZIP, the v1.0 dataset's compression), DeepCAM's HDF5 samples with
their statistics file, HEP's benchmark chunks.  Manifests are checked by ``sha256sum -c``, GZIP verdicts
against Python's gzip module, HDF5 verdicts against h5py, subsets against the source rows.  Nothing is called
verified about nothing: an empty or partial manifest, a folder of links, entries that are no files, an ``--n``
larger than a folder or split holds."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import subprocess
import sys
import zlib

import h5py
import numpy as np
import pytest

from common.storage.tfrecord import masked_crc32c
from conftest import REPO, python_env
from hep_cnn.synth import write_benchmark


def tool(module, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args, *(() if args[0] == "subset" else ("--no-progress",))],
                          cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def cosmo_gzip(tiny_cosmo_data, tmp_path):
    """The tiny CosmoFlow set as the v1.0 dataset ships it (each TFRecord GZIP-compressed, still *.tfrecord),
    plus a README that is no sample."""
    root = tmp_path / "cosmo"
    for split in ("train", "validation"):
        (root / split).mkdir(parents=True)
        for path in sorted((tiny_cosmo_data / split).glob("*.tfrecord")):
            (root / split / path.name).write_bytes(gzip.compress(path.read_bytes()))
    (root / "README").write_text("mock universes\n")
    return root


def test_subset_is_reproducible_keeps_the_layout_and_reads_only_the_source(cosmo_gzip, tmp_path):
    before = snapshot(cosmo_gzip)
    first = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(tmp_path / "a"), "--n", "3",
                 "--seed", "5")
    assert first.returncode == 0, first.stderr
    again = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(tmp_path / "b"), "--n", "3",
                 "--seed", "5")
    other = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(tmp_path / "c"), "--n", "3",
                 "--seed", "6")
    assert again.returncode == other.returncode == 0
    names = {run: sorted(p.relative_to(tmp_path / run).as_posix() for p in (tmp_path / run).rglob("*") if p.is_file())
             for run in "abc"}
    assert names["a"] == names["b"] != names["c"]
    assert sum(n.startswith("train/") for n in names["a"]) == 3 and sum(n.startswith("validation/") for n in names["a"]) == 3
    assert "README" in names["a"]
    for name in names["a"]:   # byte for byte the source's files
        assert (tmp_path / "a" / name).read_bytes() == (cosmo_gzip / name).read_bytes()
    assert snapshot(cosmo_gzip) == before
    # Never into (or around) the source, never into a folder that holds something.
    inside = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(cosmo_gzip / "small"), "--n", "1")
    assert inside.returncode == 2 and "must be outside the source folder" in inside.stderr
    full = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(tmp_path / "a"), "--n", "1")
    assert full.returncode == 2 and "absent or empty folder" in full.stderr
    assert snapshot(cosmo_gzip) == before


def test_manifest_is_sha256sum_compatible_written_once_and_verify_names_what_differs(cosmo_gzip, tmp_path):
    manifest = tmp_path / "cosmo.sha256"
    made = tool("cosmoflow.data", "manifest", "--from", str(cosmo_gzip), "--out", str(manifest))
    assert made.returncode == 0, made.stderr
    assert len(manifest.read_text().splitlines()) == 49   # 32 + 16 samples and the README
    check = subprocess.run(["sha256sum", "--quiet", "-c", str(manifest)], cwd=cosmo_gzip, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    once = tool("cosmoflow.data", "manifest", "--from", str(cosmo_gzip), "--out", str(manifest))
    assert once.returncode == 2 and "a manifest is written once" in once.stderr
    into = tool("cosmoflow.data", "manifest", "--from", str(cosmo_gzip), "--out", str(cosmo_gzip / "m.sha256"))
    assert into.returncode == 2 and not (cosmo_gzip / "m.sha256").exists()
    good = tool("cosmoflow.data", "verify", "--from", str(cosmo_gzip), "--manifest", str(manifest), "--workers", "2")
    assert good.returncode == 0 and "49 file(s)" in good.stdout, good.stderr
    # A download gone wrong: one file with a changed byte (still a valid GZIP stream of a valid TFRecord: its
    # checksum made again; only the manifest can tell), one missing, one extra.
    copy = tmp_path / "download"
    shutil.copytree(cosmo_gzip, copy)
    changed, gone = sorted((copy / "train").glob("*.tfrecord"))[:2]
    record = bytearray(gzip.decompress(changed.read_bytes()))
    record[20] ^= 0xFF
    record[-4:] = struct.pack("<I", masked_crc32c(bytes(record[12:-4])))
    changed.write_bytes(gzip.compress(bytes(record)))
    gone.unlink()
    (copy / "notes.txt").write_text("mine\n")
    bad = tool("cosmoflow.data", "verify", "--from", str(copy), "--manifest", str(manifest))
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2, bad.stderr
    assert len(errors) == 2 and f"{changed}: sha256" in bad.stderr and "differs from the manifest" in bad.stderr
    assert f"{gone}: listed in {manifest} but missing" in bad.stderr
    assert "note: notes.txt is not in the manifest" in bad.stderr


def gzip_verdict(data: bytes) -> bool:
    """Python's gzip module: does the stream inflate whole (every member's CRC and length)?"""
    try:
        gzip.decompress(data)
    except (gzip.BadGzipFile, EOFError, zlib.error):
        return False
    return True


def test_verify_names_a_corrupt_or_truncated_gzip_member_as_pythons_gzip_does(tmp_path):
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 8, 3_000_000, dtype=np.int16).tobytes()   # compressible, several chunks inflated
    member = gzip.compress(payload, compresslevel=1)
    files = {
        "whole.tfrecord": member,
        "two-members.tfrecord": member + gzip.compress(b"second member"),
        "truncated.tfrecord": member[: len(member) * 2 // 3],
        "cut-in-trailer.tfrecord": member[:-3],
        "corrupt.tfrecord": member[:len(member) // 2] + bytes([member[len(member) // 2] ^ 0xFF]) + member[len(member) // 2 + 1:],
        "plain.bin": payload[:1000],
    }
    folder = tmp_path / "files"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    result = tool("cosmoflow.data", "verify", "--from", str(folder))
    named = {name for name in files if f"error: {folder / name}:" in result.stderr}
    expected = {name for name, data in files.items() if name.endswith(".tfrecord") and not gzip_verdict(data)}
    assert expected == {"truncated.tfrecord", "cut-in-trailer.tfrecord", "corrupt.tfrecord"}
    assert named == expected and result.returncode == 2, result.stderr
    assert "truncated GZIP member" in result.stderr and "corrupt GZIP member" in result.stderr


def test_deepcam_subset_keeps_the_statistics_files(tmp_path):
    root = tmp_path / "deepcam"
    for split in ("train", "validation"):
        (root / split).mkdir(parents=True)
        for i in range(5):
            with h5py.File(root / split / f"data-2106-01-0{i + 1}-00-00-0-1.h5", "w") as f:
                f.create_dataset("climate/data", data=np.full((4, 6, 16), i, np.float32))
                f.create_dataset("climate/labels_0", data=np.zeros((4, 6), np.float32))
    with h5py.File(root / "stats.h5", "w") as f:
        f.create_dataset("climate/minval", data=np.zeros(16, np.float32))
    with h5py.File(root / "train" / "stats.h5", "w") as f:   # the SC18 layout keeps one per split
        f.create_dataset("climate/stats", data=np.zeros((16, 4), np.float32))
    result = tool("climate_seg.cam5.data", "subset", "--from", str(root), "--to", str(tmp_path / "small"), "--n", "2")
    assert result.returncode == 0, result.stderr
    small = tmp_path / "small"
    assert (small / "stats.h5").read_bytes() == (root / "stats.h5").read_bytes()
    assert (small / "train" / "stats.h5").read_bytes() == (root / "train" / "stats.h5").read_bytes()
    for split in ("train", "validation"):
        assert len(list((small / split).glob("data-*.h5"))) == 2


def test_hep_subset_draws_rows_across_chunks(tmp_path):
    root = tmp_path / "hep"
    root.mkdir()
    rng = np.random.default_rng(1)
    sources = []
    for chunk in range(2):
        n = 8
        images = rng.random((n, 3, 4, 6), dtype=np.float32)
        labels = (np.arange(n) + 100 * chunk).astype(np.float32)   # each row told apart by its label
        write_benchmark(root / f"hep_training_chunk{chunk}.hdf5", images, labels, np.ones(n, np.float32),
                        np.zeros(n, bool))
        sources.append(root / f"hep_training_chunk{chunk}.hdf5")
    result = tool("hep_cnn.data", "subset", "--from", str(root), "--to", str(tmp_path / "small"), "--n", "5", "--seed", "3")
    assert result.returncode == 0, result.stderr
    rows = {}
    for path in sources:
        with h5py.File(path, "r") as f:
            for i, label in enumerate(f["label"][()]):
                rows[float(label)] = {name: f[name][i] for name in ("data", "label", "weight", "normweight", "psr")}
    taken = 0
    for path in sorted((tmp_path / "small").glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            assert set(f) == {"data", "label", "weight", "normweight", "psr"} and dict(f.attrs)
            assert f["data"].compression == "gzip"
            for i, label in enumerate(f["label"][()]):
                for name, value in rows[float(label)].items():   # every dataset's row i is the source's row
                    np.testing.assert_array_equal(f[name][i], value)
            taken += len(f["label"])
    assert taken == 5
    assert sorted(os.listdir(root)) == [p.name for p in sources]   # the source folder as it was


# -- never "verified" about nothing; every entry named; subsets as asked (issue 46) --------------------------

def hep_folder(root, rows=(("training", 8), ("validation", 4), ("test", 4))):
    """HEP benchmark chunks, one per split (``hep_<split>_chunk0.hdf5``), each row told apart by its label."""
    root.mkdir()
    rng = np.random.default_rng(2)
    for offset, (split, n) in enumerate(rows):
        labels = (np.arange(n) + 100 * offset).astype(np.float32)
        write_benchmark(root / f"hep_{split}_chunk0.hdf5", rng.random((n, 3, 4, 6), dtype=np.float32), labels,
                        np.ones(n, np.float32), np.zeros(n, bool))
    return root


def errors_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_verify_never_calls_an_empty_or_partial_manifest_or_an_empty_folder_verified(tmp_path):
    hep = hep_folder(tmp_path / "hep")
    manifest = tmp_path / "hep.sha256"
    assert tool("hep_cnn.data", "manifest", "--from", str(hep), "--out", str(manifest)).returncode == 0
    whole = tool("hep_cnn.data", "verify", "--from", str(hep), "--manifest", str(manifest))
    assert whole.returncode == 0 and f"3 file(s) under {hep} read whole; {manifest} lists 3" in whole.stdout
    # A README the manifest does not list is noted; the samples are all listed, so the folder is verified.
    (hep / "README").write_text("synthetic events\n")
    noted = tool("hep_cnn.data", "verify", "--from", str(hep), "--manifest", str(manifest))
    assert noted.returncode == 0 and "note: README is not in the manifest" in noted.stderr, noted.stderr
    empty = tmp_path / "empty.sha256"
    empty.write_text("")
    result = tool("hep_cnn.data", "verify", "--from", str(hep), "--manifest", str(empty))
    assert result.returncode == 2 and errors_of(result) == [
        f"error: {empty}: lists no files; an empty manifest verifies nothing (write one with manifest --from DIR "
        "--out FILE)"]
    partial = tmp_path / "partial.sha256"
    partial.write_text(manifest.read_text().splitlines()[0] + "\n")
    result = tool("hep_cnn.data", "verify", "--from", str(hep), "--manifest", str(partial))
    assert result.returncode == 2 and errors_of(result) == [
        f"error: {hep}: 2 sample file(s) that {partial} does not list (hep_training_chunk0.hdf5, "
        "hep_validation_chunk0.hdf5); a partial manifest verifies nothing about them (write a manifest of the "
        "whole folder)"], result.stderr
    assert f"4 file(s) under {hep}; {partial} lists 1" in result.stderr
    # A folder with no file at all (an empty subfolder is no file): nothing to verify, no manifest of nothing.
    (tmp_path / "nothing" / "train").mkdir(parents=True)
    for args in (("verify", "--from", str(tmp_path / "nothing")),
                 ("verify", "--from", str(tmp_path / "nothing"), "--manifest", str(manifest)),
                 ("manifest", "--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "nothing.sha256"))):
        result = tool("hep_cnn.data", *args)
        assert result.returncode == 2 and errors_of(result)[0].startswith(
            f"error: {tmp_path / 'nothing'}: holds no files; "), result.stderr
    assert not (tmp_path / "nothing.sha256").exists()


def without_file_permission_overrides(module, *args) -> subprocess.CompletedProcess:
    """``tool`` as root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: file modes apply, as for a user (as root
    they do not, and os.access, which the listing asks, says so too)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to drop the file-permission capabilities")
    return subprocess.run([setpriv, "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-m", module,
                           *args, "--no-progress"], cwd=REPO, env=python_env(), capture_output=True, text=True,
                          timeout=300)


def test_a_dataset_of_links_is_read_through_them_and_entries_that_are_no_files_are_named(tmp_path):
    hep = hep_folder(tmp_path / "hep")
    source_manifest, links_manifest = tmp_path / "hep.sha256", tmp_path / "links.sha256"
    assert tool("hep_cnn.data", "manifest", "--from", str(hep), "--out", str(source_manifest)).returncode == 0
    links = tmp_path / "links"
    (links / "more").mkdir(parents=True)
    for path in sorted(hep.iterdir()):
        (links / path.name).symlink_to(path)
    (links / "more" / "README").write_text("a folder of links\n")
    (links / "elsewhere").symlink_to(links / "more")   # a link to a folder: read through it too
    made = tool("hep_cnn.data", "manifest", "--from", str(links), "--out", str(links_manifest))
    assert made.returncode == 0 and "sha256 of 5 file(s)" in made.stdout, made.stderr
    lines = links_manifest.read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["elsewhere/README", "hep_test_chunk0.hdf5",
                                                       "hep_training_chunk0.hdf5", "hep_validation_chunk0.hdf5",
                                                       "more/README"]
    assert set(source_manifest.read_text().splitlines()) <= set(lines)   # the targets' sha256 under the links' names
    check = subprocess.run(["sha256sum", "--quiet", "-c", str(links_manifest)], cwd=links, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    good = tool("hep_cnn.data", "verify", "--from", str(links), "--manifest", str(source_manifest))
    assert good.returncode == 0 and f"{source_manifest} lists 3, each present and matching" in good.stdout
    # Entries that cannot be read as files: each named by verify; subset and manifest refuse, writing nothing.
    (links / "gone.hdf5").symlink_to(tmp_path / "nowhere.hdf5")
    (links / "chunk.h5").mkdir()
    (links / "deep").mkdir()
    (links / "deep" / "loop").symlink_to(links)
    result = tool("hep_cnn.data", "verify", "--from", str(links), "--manifest", str(source_manifest))
    assert result.returncode == 2 and errors_of(result) == [
        f"error: {links / 'chunk.h5'}: a folder with a HEP sample file's name",
        f"error: {links / 'deep' / 'loop'}: a symbolic link to {links}, a folder above it (a loop)",
        f"error: {links / 'gone.hdf5'}: a symbolic link to {tmp_path / 'nowhere.hdf5'}, which does not exist"], \
        result.stderr
    refused = tool("hep_cnn.data", "manifest", "--from", str(links), "--out", str(tmp_path / "again.sha256"))
    assert refused.returncode == 2 and errors_of(refused) == [
        f"error: {links / 'chunk.h5'}: a folder with a HEP sample file's name; and 2 more entries that cannot be "
        "read as files; no manifest written"]
    assert not (tmp_path / "again.sha256").exists()
    refused = tool("hep_cnn.data", "subset", "--from", str(links), "--to", str(tmp_path / "small"), "--n", "1")
    assert refused.returncode == 2 and "and 2 more entries that cannot be read as files; nothing was written" in \
        refused.stderr and not (tmp_path / "small").exists()
    # A file without read permission, for a user (root reads it whatever its mode).
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    shutil.copyfile(hep / "hep_test_chunk0.hdf5", unreadable / "hep_test_chunk0.hdf5")
    os.chmod(unreadable / "hep_test_chunk0.hdf5", 0)
    result = without_file_permission_overrides("hep_cnn.data", "verify", "--from", str(unreadable))
    assert result.returncode == 2 and errors_of(result) == [
        f"error: {unreadable / 'hep_test_chunk0.hdf5'}: cannot be read (permission denied)"], result.stderr


def h5py_reads_it_whole(path) -> bool:
    """h5py's verdict: the file opens and every dataset reads."""
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, item: item[()] if isinstance(item, h5py.Dataset) else None)
    except (OSError, KeyError, ValueError, RuntimeError):
        return False
    return True


def test_verify_names_a_truncated_hdf5_file_as_h5py_does(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    rng = np.random.default_rng(3)
    for name, options in {"earliest.h5": {}, "latest.h5": {"libver": "latest"},
                          "userblock.h5": {"userblock_size": 512}}.items():
        with h5py.File(source / name, "w", **options) as f:
            f.create_dataset("data", data=rng.random((64, 3, 8, 8), dtype=np.float32), chunks=(8, 3, 8, 8),
                             compression="gzip")
            f.create_dataset("label", data=np.arange(64))
    whole = {path.name: path.read_bytes() for path in source.iterdir()}
    files = {
        **whole,
        "cut-in-half.h5": whole["earliest.h5"][: len(whole["earliest.h5"]) // 2],
        "cut-last-byte.hdf5": whole["latest.h5"][:-1],
        "cut-in-superblock.h5": whole["earliest.h5"][:40],
        "userblock-cut.h5": whole["userblock.h5"][:-100],
        "empty.h5": b"",
        "text.h5": b"not an HDF5 file\n",
        "with-bytes-after.h5": whole["latest.h5"] + b"\x00" * 10,   # the library reads it: not named
        "plain.bin": b"no format at all",
    }
    folder = tmp_path / "files"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    result = tool("hep_cnn.data", "verify", "--from", str(folder))
    named = {name for name in files if f"error: {folder / name}:" in result.stderr}
    expected = {name for name in files if name != "plain.bin" and not h5py_reads_it_whole(folder / name)}
    assert expected == {"cut-in-half.h5", "cut-last-byte.hdf5", "cut-in-superblock.h5", "userblock-cut.h5",
                        "empty.h5", "text.h5"}
    assert named == expected and result.returncode == 2, result.stderr
    size = len(whole["earliest.h5"])
    assert f"error: {folder / 'cut-in-half.h5'}: truncated HDF5 file: its superblock puts its end at byte {size}, " \
           f"the file ends at byte {size // 2}" in result.stderr


def test_hep_subset_draws_from_every_split_and_never_fewer_than_asked(tmp_path):
    hep = hep_folder(tmp_path / "hep", rows=(("training", 16), ("validation", 4), ("test", 3)))
    result = tool("hep_cnn.data", "subset", "--from", str(hep), "--to", str(tmp_path / "small"), "--n", "3")
    assert result.returncode == 0, result.stderr
    assert "samples *test*: 3, *train*: 3, *val*: 3" in result.stdout
    for split, first_label in (("training", 0), ("validation", 100), ("test", 200)):
        with h5py.File(tmp_path / "small" / f"hep_{split}_chunk0.hdf5", "r") as f:
            labels = f["label"][()]
        assert len(labels) == 3 and all(first_label <= label < first_label + 16 for label in labels)
    # Four events asked of a split that holds three: refused, naming the split and its count; nothing written.
    result = tool("hep_cnn.data", "subset", "--from", str(hep), "--to", str(tmp_path / "four"), "--n", "4")
    assert result.returncode == 2 and errors_of(result) == [
        f"error: {hep} (its *test* files): --n 4, but it holds 3 HEP sample(s); --n counts samples per folder "
        "and split and a subset is never smaller than asked: ask for at most 3; nothing was written"]
    assert not (tmp_path / "four").exists()
    # A folder of one sample per file (CosmoFlow, DeepCAM): the same.
    cam5 = tmp_path / "cam5" / "train"
    cam5.mkdir(parents=True)
    for i in range(2):
        with h5py.File(cam5 / f"data-2106-01-0{i + 1}-00-00-0-1.h5", "w") as f:
            f.create_dataset("climate/data", data=np.zeros((4, 6, 16), np.float32))
    result = tool("climate_seg.cam5.data", "subset", "--from", str(tmp_path / "cam5"), "--to", str(tmp_path / "c"),
                  "--n", "3")
    assert result.returncode == 2 and errors_of(result) == [
        f"error: {cam5}: --n 3, but it holds 2 CAM5 (DeepCAM) sample(s); --n counts samples per folder and a "
        "subset is never smaller than asked: ask for at most 2; nothing was written"]


def test_subset_errors_are_one_line_naming_the_path_and_a_link_to_an_empty_folder_is_filled(tmp_path):
    hep = hep_folder(tmp_path / "hep")
    data = (hep / "hep_training_chunk0.hdf5").read_bytes()
    (hep / "hep_training_chunk0.hdf5").write_bytes(data[: len(data) // 2])
    result = tool("hep_cnn.data", "subset", "--from", str(hep), "--to", str(tmp_path / "small"), "--n", "1")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: {hep / 'hep_training_chunk0.hdf5'}: not a readable HDF5 file of the "
                                    "HEP layout (") and "truncated file" in result.stderr
    (hep / "hep_training_chunk0.hdf5").write_bytes(data)
    (tmp_path / "a_file").write_text("")
    result = tool("hep_cnn.data", "subset", "--from", str(hep), "--to", str(tmp_path / "a_file" / "small"), "--n", "1")
    assert result.returncode == 2 and result.stderr == (
        f"error: {tmp_path / 'a_file' / 'small'}: cannot be created: {tmp_path / 'a_file'} is a file, not a folder; "
        "nothing was written\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    result = tool("hep_cnn.data", "subset", "--from", str(hep), "--to", str(tmp_path / "dangling"), "--n", "1")
    assert result.returncode == 2 and result.stderr.startswith(
        f"error: {tmp_path / 'dangling'}: a symbolic link to {tmp_path / 'nowhere'}, which does not exist")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "scratch" / "mine").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "scratch" / "mine")
    result = tool("hep_cnn.data", "subset", "--from", str(hep), "--to", str(tmp_path / "link"), "--n", "2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "link").is_symlink() and sorted(os.listdir(tmp_path / "scratch" / "mine")) == sorted(
        os.listdir(hep))
    assert os.listdir(tmp_path / "scratch") == ["mine"]   # no work folder left beside it


def tfrecord(*payloads: bytes) -> bytes:
    """A TFRecord stream of ``payloads``, framed with their checksums as TensorFlow writes them."""
    out = b""
    for payload in payloads:
        length = struct.pack("<Q", len(payload))
        out += length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))
    return out


def tfrecord_verdict(path) -> bool:
    """The suite's own TFRecord reader (every checksum verified): does the file read whole?"""
    from common.errors import DataError
    from common.storage.tfrecord import scan_tfrecord

    try:
        scan_tfrecord(str(path), "gzip" if path.read_bytes()[:2] == b"\x1f\x8b" else "none", verify_data=True)
    except DataError:
        return False
    return True


def test_verify_and_manifest_name_a_truncated_or_corrupt_tfrecord_as_the_reader_does(tmp_path):
    """An uncompressed TFRecord cut in a copy (no GZIP or HDF5 check can see it) is walked record by record:
    verify names it with the byte where it ends, manifest refuses the folder; the same for a TFRecord cut at a
    record inside a whole GZIP stream, and a checksum that does not hold.  Verdicts as the suite's reader gives."""
    whole = tfrecord(b"x" * 30_000, b"y" * 5_000)
    flipped = bytearray(whole)
    flipped[100] ^= 1
    files = {
        "whole.tfrecord": whole,
        "empty.tfrecord": b"",
        "cut-in-data.tfrecord": whole[:20_000],
        "cut-in-header.tfrecord": whole[:30_016 + 5],
        "cut-in-footer.tfrecord": whole[:-2],
        "bad-data-crc.tfrecord": bytes(flipped),
        "whole.tfrecord.gz": gzip.compress(whole),
        "inflates-to-a-cut-record.tfrecord.gz": gzip.compress(whole[:-100]),
        "notes.txt": b"not a TFRecord, and not named one\n",
    }
    folder = tmp_path / "files"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    result = tool("cosmoflow.data", "verify", "--from", str(folder))
    named = {name for name in files if f"error: {folder / name}:" in result.stderr}
    expected = {name for name in files if name != "notes.txt" and not tfrecord_verdict(folder / name)}
    assert expected == {"cut-in-data.tfrecord", "cut-in-header.tfrecord", "cut-in-footer.tfrecord",
                        "bad-data-crc.tfrecord", "inflates-to-a-cut-record.tfrecord.gz"}
    assert named == expected and result.returncode == 2, result.stderr
    assert (f"{folder / 'cut-in-data.tfrecord'}: truncated TFRecord file: record 0 (at byte 0) needs bytes up to "
            "30016, the file ends at byte 20000") in result.stderr
    assert "the inflated stream ends at byte" in result.stderr and "data checksum of record 0" in result.stderr
    made = tool("cosmoflow.data", "manifest", "--from", str(folder), "--out", str(tmp_path / "m.sha256"))
    assert made.returncode == 2 and f"{folder / 'cut-in-data.tfrecord'}: truncated TFRecord" in made.stderr
    assert made.stderr.strip().endswith("no manifest written") and not (tmp_path / "m.sha256").exists()


def test_a_manifest_listing_a_path_twice_or_outside_the_folder_is_refused(tmp_path):
    """Which of two digests for one path holds would be a guess (the last one used to win); an entry outside
    the folder is no file of it (it used to be called missing).  One line naming the manifest, the line(s)."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a")
    (tmp_path / "elsewhere.bin").write_bytes(b"e")
    good = tool("cosmoflow.data", "manifest", "--from", str(folder), "--out", str(tmp_path / "good.sha256"))
    assert good.returncode == 0, good.stderr
    line = (tmp_path / "good.sha256").read_text()
    wrong = "0" * 64 + "  a.bin\n"
    cases = {"twice.sha256": (wrong + line, "a.bin is listed twice (lines 1 and 2)", 2),
             "up.sha256": (line + "0" * 64 + "  ../elsewhere.bin\n", "../elsewhere.bin points outside the folder", 2),
             "absolute.sha256": (line + "0" * 64 + f"  {tmp_path / 'elsewhere.bin'}\n", "points outside the folder", 2)}
    for name, (text, message, number) in cases.items():
        (tmp_path / name).write_text(text)
        result = tool("cosmoflow.data", "verify", "--from", str(folder), "--manifest", str(tmp_path / name))
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)
        assert result.stderr.startswith(f"error: {tmp_path / name}:{number}: ") and message in result.stderr, name


def test_a_second_subset_into_a_finished_one_says_what_it_found(cosmo_gzip, tmp_path):
    first = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(tmp_path / "small"), "--n", "1")
    assert first.returncode == 0, first.stderr
    again = tool("cosmoflow.data", "subset", "--from", str(cosmo_gzip), "--to", str(tmp_path / "small"), "--n", "1")
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert again.stderr.startswith(f"error: {tmp_path / 'small'}: a folder holding 3 entries: README, train/, "
                                   "validation/ (an earlier subset, or a dataset?)")
    assert "choose a new --to" in again.stderr
    assert "expected a" not in again.stderr
