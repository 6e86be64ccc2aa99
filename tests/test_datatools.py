"""The data tools (common/tools/datatools.py) through each application's data module, on files in the published
layouts: CosmoFlow's TFRecords (plain and GZIP, the v1.0 dataset's compression), DeepCAM's HDF5 samples with
their statistics file, HEP's benchmark chunks.  Manifests are checked by ``sha256sum -c``, GZIP verdicts
against Python's gzip module, subsets against the source rows."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import zlib

import h5py
import numpy as np
import pytest

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
    # A download gone wrong: one file with a flipped byte (still a valid GZIP stream), one missing, one extra.
    copy = tmp_path / "download"
    shutil.copytree(cosmo_gzip, copy)
    changed, gone = sorted((copy / "train").glob("*.tfrecord"))[:2]
    changed.write_bytes(gzip.compress(gzip.decompress(changed.read_bytes())[:-1] + b"\x00"))
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
