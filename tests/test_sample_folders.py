"""Sample folders never shrink silently, and generated data goes where it was asked (issue 46).

Every entry of a data folder that matches a sample pattern but is no readable regular file (a dangling link, a
folder with a sample's name) is named by the applications' own listing: an error naming the first and counting
the others, or with ``data.on_bad_file: skip`` a bad file like any other (left out, reported).  A folder of links
to samples is a dataset like any other.  A generator asked to fill a symbolic link to an empty folder fills the
folder it points to; a link to nothing, or a path under a file, is refused in one line before any work.  Real
files in the real formats, the generators as real processes."""

import os

import numpy as np
import pytest

from common.config import validate
from common.distributed import Distributed
from common.errors import DataError
from conftest import REPO, run_python, tiny_cosmo_overrides
from hep_cnn.synth import write_benchmark

GENERATORS = {   # the smallest data each writes (as in test_outputs.py)
    "cosmoflow.mock": ["--n-train", "2", "--n-validation", "1", "--size", "8", "--workers", "1"],
    "climate_seg.cam5.synth": ["--grid", "8", "12", "--n-train", "1", "--n-validation", "1", "--n-test", "1"],
    "hep_cnn.synth": ["--n-train", "4", "--n-validation", "2", "--n-test", "2", "--image-size", "8"],
}


@pytest.mark.parametrize("module", sorted(GENERATORS))
def test_generators_write_through_a_link_to_an_empty_folder(module, tmp_path):
    folder = tmp_path / "scratch" / "data"
    folder.mkdir(parents=True)
    link = tmp_path / "data"
    link.symlink_to(folder)
    run_python(["-m", module, "--out", str(link), *GENERATORS[module]])
    assert link.is_symlink() and os.readlink(link) == str(folder)
    assert any(path.suffix in (".tfrecord", ".h5", ".nc") for path in folder.rglob("*"))
    assert os.listdir(tmp_path / "scratch") == ["data"]   # no work folder left beside it
    assert sorted(os.listdir(tmp_path)) == ["data", "scratch"]


@pytest.mark.parametrize("module", sorted(GENERATORS))
def test_generators_refuse_a_link_to_nothing_or_a_folder_under_a_file_before_any_work(module, tmp_path):
    link = tmp_path / "data"
    link.symlink_to(tmp_path / "nowhere")
    (tmp_path / "a_file").write_text("")
    for out, expected in ((link, f"error: {link}: a symbolic link to {tmp_path / 'nowhere'}, which does not exist; "),
                          (tmp_path / "a_file" / "data", f"error: {tmp_path / 'a_file' / 'data'}: cannot be created: "
                                                         f"{tmp_path / 'a_file'} is a file, not a folder; nothing was "
                                                         "written")):
        result = run_python(["-m", module, "--out", str(out), *GENERATORS[module]], check=False)
        # One line and nothing else: no progress of a generation that would have been thrown away.
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(expected), result.stderr
    assert sorted(os.listdir(tmp_path)) == ["a_file", "data"]


def hep_cfg(data_dir, on_bad_file):
    from hep_cnn.config import HepConfig

    return validate(HepConfig, {"data": {"data_dir": str(data_dir), "image_size": 8, "chunk_size": 4,
                                         "on_bad_file": on_bad_file}}, "test")


def test_hep_listing_names_every_entry_that_is_no_readable_file(tmp_path):
    from hep_cnn.data import check_data, split_chunks

    rng = np.random.default_rng(0)
    for name, n in (("train_0000.h5", 8), ("val_0000.h5", 4), ("test_0000.h5", 4)):
        write_benchmark(tmp_path / name, rng.random((n, 3, 8, 8), dtype=np.float32), rng.integers(0, 2, n),
                        np.ones(n, np.float32), np.zeros(n, np.int32))
    (tmp_path / "train_0001.h5").symlink_to(tmp_path / "train_0000.h5")   # a link to a sample: a sample
    (tmp_path / "train_0002.h5").symlink_to("gone.h5")
    (tmp_path / "train_0003.hdf5").mkdir()
    with pytest.raises(DataError) as raised:
        split_chunks(hep_cfg(tmp_path, "fail"), "train")
    assert str(raised.value) == (
        f"{tmp_path / 'train_0002.h5'}: a symbolic link to gone.h5, which does not exist; and 1 more entry matching "
        "*.h5 or *.hdf5 that cannot be read as files (data.on_bad_file: skip leaves them out)")
    problems = []
    chunks = split_chunks(hep_cfg(tmp_path, "skip"), "train", Distributed(), problems)
    assert sorted({chunk.path for chunk in chunks}) == [str(tmp_path / "train_0000.h5"), str(tmp_path / "train_0001.h5")]
    assert sum(chunk.stop - chunk.start for chunk in chunks) == 16
    assert problems == [f"{tmp_path / 'train_0002.h5'}: a symbolic link to gone.h5, which does not exist",
                        f"{tmp_path / 'train_0003.hdf5'}: a folder, not a file"]
    # The data checker (python -m common.tools.check_data) names each one, and checks the others.
    checked, problems = check_data(hep_cfg(tmp_path, "fail"))
    assert checked == 6 and problems[:2] == [
        f"{tmp_path / 'train_0002.h5'}: a symbolic link to gone.h5, which does not exist",
        f"{tmp_path / 'train_0003.hdf5'}: a folder, not a file"], problems


def test_cosmoflow_listing_reads_a_folder_of_links_and_names_what_is_no_file(tiny_cosmo_data, tmp_path):
    from cosmoflow.config import CosmoflowConfig
    from cosmoflow.data import split

    train = tmp_path / "train"
    train.mkdir()
    samples = sorted((tiny_cosmo_data / "train").glob("*.tfrecord"))
    for path in samples:
        (train / path.name).symlink_to(path)
    (train / "univ_train_999999.tfrecord").symlink_to(tmp_path / "moved" / "univ_train_999999.tfrecord")
    (train / "univ_train_extra.tfrecord").mkdir()

    def cfg(on_bad_file):
        return validate(CosmoflowConfig, {"data": {"data_dir": str(tmp_path), "sample_shape": [16, 16, 16, 4],
                                                   "on_bad_file": on_bad_file}}, "test")

    with pytest.raises(DataError) as raised:
        split(cfg("fail"), "train", Distributed())
    assert str(raised.value).startswith(
        f"{train / 'univ_train_999999.tfrecord'}: a symbolic link to {tmp_path / 'moved'}/univ_train_999999.tfrecord, "
        "which does not exist; and 1 more entry matching ")
    listed = split(cfg("skip"), "train", Distributed())
    assert listed.items == [str(train / path.name) for path in samples] and listed.count == len(samples) == 32
    assert listed.skipped == [f"{train / 'univ_train_999999.tfrecord'}: a symbolic link to "
                        f"{tmp_path / 'moved' / 'univ_train_999999.tfrecord'}, which does not exist",
                        f"{train / 'univ_train_extra.tfrecord'}: a folder, not a file"]


def test_training_on_a_folder_of_links_with_a_dangling_one_is_refused_in_one_line(tiny_cosmo_data, tmp_path):
    for split in ("train", "validation"):
        (tmp_path / "data" / split).mkdir(parents=True)
        for path in sorted((tiny_cosmo_data / split).glob("*.tfrecord")):
            (tmp_path / "data" / split / path.name).symlink_to(path)
    gone = tmp_path / "data" / "train" / "univ_train_999999.tfrecord"
    gone.symlink_to(tmp_path / "moved.tfrecord")
    result = run_python(["-m", "cosmoflow.train", "--config", str(REPO / "configs/cosmoflow/demo.yaml"),
                         *tiny_cosmo_overrides(tmp_path / "data", epochs=1), "--output-dir", str(tmp_path / "run")],
                        check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and errors == [
        f"error: {gone}: a symbolic link to {tmp_path / 'moved.tfrecord'}, which does not exist (data.on_bad_file: "
        "skip leaves it out)"], result.stderr[-3000:]
    assert not (tmp_path / "run" / "config.yaml").exists()
