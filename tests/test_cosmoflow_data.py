"""CosmoFlow readers on files written here in the real formats (TFRecord, GZIP, HDF5)."""

import json

import h5py
import numpy as np
import pytest
import tensorflow as tf

from common.config import validate
from common.distributed import Distributed
from common.errors import DataError
from cosmoflow.config import CosmoflowConfig
from cosmoflow.data import augment, build_datasets, evaluation_dataset, read_targets

SHAPE = (8, 8, 8, 4)


def config(data_dir, **data):
    raw = {"data": {"data_dir": str(data_dir), "sample_shape": list(SHAPE), "batch_size": 2, **data}}
    return validate(CosmoflowConfig, raw, "test")


def write_tfrecords(directory, samples, per_file=1, gzip=False):
    """Written with TF's own writer and tf.train.Example, independently of cosmoflow.mock."""
    directory.mkdir(parents=True)
    options = tf.io.TFRecordOptions(compression_type="GZIP" if gzip else "")
    suffix = ".tfrecord.gz" if gzip else ".tfrecord"
    for start in range(0, len(samples), per_file):
        with tf.io.TFRecordWriter(str(directory / f"part_{start:04d}{suffix}"), options) as writer:
            for x, y in samples[start:start + per_file]:
                feature = {"x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.astype("<i2").tobytes()])),
                           "y": tf.train.Feature(float_list=tf.train.FloatList(value=list(y)))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def make_samples(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 50, SHAPE).astype(np.int16), rng.uniform(-1, 1, 4).astype(np.float32)) for _ in range(n)]


@pytest.mark.parametrize("gzip, per_file", [(False, 1), (True, 1), (False, 4)])
def test_tfrecord_values_and_counts(tmp_path, gzip, per_file):
    train, valid = make_samples(12, 0), make_samples(8, 1)
    write_tfrecords(tmp_path / "train", train, per_file, gzip)
    write_tfrecords(tmp_path / "validation", valid, per_file, gzip)
    cfg = config(tmp_path, compression="gzip" if gzip else "none", samples_per_file=per_file)
    datasets = build_datasets(cfg, Distributed())
    assert (datasets.steps_per_epoch, datasets.validation_steps) == (6, 4)
    assert datasets.train_samples == 12

    # Validation keeps file order: compare every value with log1p of what was written.
    x, y = next(iter(datasets.validation))
    np.testing.assert_allclose(x.numpy(), np.log1p(np.stack([s[0] for s in valid[:2]]).astype(np.float32)), rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), np.stack([s[1] for s in valid[:2]]))

    # One training epoch is a permutation of all training samples.
    seen = sorted(float(v) for _, y in datasets.train_epoch(0).take(6) for v in y.numpy()[:, 0])
    assert seen == pytest.approx(sorted(float(s[1][0]) for s in train))


def test_a_shuffle_buffer_larger_than_the_epoch_shuffles_within_the_epoch(tmp_path):
    """data.shuffle_buffer above a rank's epoch: the epoch is still each training sample once, and it ends
    there (no sample of the next pass read, discarded or mixed in)."""
    train = make_samples(12, 0)
    write_tfrecords(tmp_path / "train", train)
    write_tfrecords(tmp_path / "validation", make_samples(4, 1))
    datasets = build_datasets(config(tmp_path, shuffle_buffer=100), Distributed())
    batches = list(datasets.train_epoch(0))
    assert len(batches) == datasets.steps_per_epoch == 6
    seen = sorted(float(v) for _, y in batches for v in y.numpy()[:, 0])
    assert seen == pytest.approx(sorted(float(s[1][0]) for s in train))


def test_target_selection_and_no_log(tmp_path):
    samples = make_samples(4, 2)
    write_tfrecords(tmp_path / "train", samples)
    write_tfrecords(tmp_path / "validation", samples)
    cfg = config(tmp_path, target_names=["sigma_8", "Omega_m"], apply_log=False)
    dataset, count = evaluation_dataset(cfg)
    x, y = next(iter(dataset))
    assert count == 4 and y.shape == (2, 2)
    np.testing.assert_allclose(y.numpy(), np.stack([s[1][[1, 0]] for s in samples[:2]]))
    expected = samples[0][0] / samples[0][0].mean()
    np.testing.assert_allclose(x.numpy()[0], expected, rtol=1e-5)
    np.testing.assert_allclose(read_targets(cfg, "train"), np.stack([s[1][[1, 0]] for s in samples]))


def test_hdf5_volumes_are_cut_into_crops(tmp_path):
    rng = np.random.default_rng(5)
    for split, n in (("train", 2), ("validation", 1)):
        (tmp_path / split).mkdir()
        for i in range(n):
            with h5py.File(tmp_path / split / f"univ_{i}.h5", "w") as f:
                f["full"] = rng.integers(0, 30, (16, 16, 8, 4)).astype(np.int16)
                f["unitPar"] = np.full(4, i / 10, np.float32)
    cfg = config(tmp_path, format="hdf5")
    datasets = build_datasets(cfg, Distributed())
    assert datasets.train_samples == 2 * 4 and datasets.validation_samples == 4
    dataset, count = evaluation_dataset(cfg)
    crops = np.concatenate([x.numpy() for x, _ in dataset])
    with h5py.File(tmp_path / "validation" / "univ_0.h5") as f:
        full = np.log1p(f["full"][:].astype(np.float32))
    expected = [full[i * 8:(i + 1) * 8, j * 8:(j + 1) * 8, :, :] for i in range(2) for j in range(2)]
    np.testing.assert_allclose(crops, np.stack(expected), rtol=1e-6)


@pytest.mark.parametrize("case, pattern", [
    ("missing", r"train TFRecord directory not found"),
    ("empty", "no CosmoFlow train TFRecord files"),
    ("too_many", r"data.n_train=99 but only 4 samples are present"),
    ("per_file", "holds 1 records but data.samples_per_file is 2"),
    ("small", "cannot fill one batch of 2"),
    ("hdf5_layout", "expected datasets 'full' and 'unitPar'"),
])
def test_bad_input_is_a_clear_error(tmp_path, case, pattern):
    overrides = {}
    if case != "missing":
        (tmp_path / "train").mkdir()
        (tmp_path / "validation").mkdir()
    if case in ("too_many", "per_file", "small"):
        (tmp_path / "train").rmdir()
        (tmp_path / "validation").rmdir()
        write_tfrecords(tmp_path / "train", make_samples(4 if case != "small" else 1, 0))
        write_tfrecords(tmp_path / "validation", make_samples(4, 1))
    overrides = {"too_many": {"n_train": 99}, "per_file": {"samples_per_file": 2}}.get(case, {})
    if case == "hdf5_layout":
        with h5py.File(tmp_path / "train" / "bad.h5", "w") as f:
            f["data"] = np.zeros((8, 8, 8, 4))
        overrides = {"format": "hdf5"}
    with pytest.raises(DataError, match=pattern):
        build_datasets(config(tmp_path, **overrides), Distributed())


def test_staging_copies_this_ranks_share(tmp_path, tmp_path_factory):
    write_tfrecords(tmp_path / "train", make_samples(6, 8))
    write_tfrecords(tmp_path / "validation", make_samples(4, 9))
    stage = tmp_path_factory.mktemp("stage")   # outside the data folder (tmp_path), as staging requires
    cfg = config(tmp_path, stage_dir=str(stage))

    class Rank1(Distributed):
        def __init__(self):
            super().__init__()
            self.rank, self.size = 1, 2

    datasets = build_datasets(cfg, Rank1())
    staged = sorted(p.name for p in (stage / "rank-1").glob("*.tfrecord"))
    assert staged == ["part_0001.tfrecord", "part_0003.tfrecord", "part_0005.tfrecord"]
    values = sorted(round(float(v), 6) for _, y in datasets.train_epoch(0).take(1) for v in y.numpy()[:, 0])
    originals = {round(float(s[1][0]), 6) for i, s in enumerate(make_samples(6, 8)) if i % 2 == 1}
    assert set(values) <= originals


def test_staging_hdf5_copies_whole_files_and_reads_their_crops(tmp_path, tmp_path_factory):
    """data.stage_dir with HDF5 (it was silently ignored): rank 1 of 2 stages files 1 and 3 of four, and its
    epoch is their crops, read from the copies."""
    rng = np.random.default_rng(7)
    volumes = [(rng.integers(0, 30, (16, 16, 8, 4)).astype(np.int16), np.full(4, i / 10, np.float32))
               for i in range(4)]
    write_hdf5_volumes(tmp_path / "train", volumes)
    write_hdf5_volumes(tmp_path / "validation", volumes[:1])
    stage = tmp_path_factory.mktemp("stage")
    cfg = config(tmp_path, format="hdf5", stage_dir=str(stage))

    class Rank1(Distributed):
        def __init__(self):
            super().__init__()
            self.rank, self.size = 1, 2

    datasets = build_datasets(cfg, Rank1())
    assert sorted(p.name for p in (stage / "rank-1").glob("*.h5")) == ["univ_1.h5", "univ_3.h5"]
    targets = sorted(round(float(y[0]), 6) for _, ys in datasets.train_epoch(0) for y in ys.numpy())
    assert targets == [0.1] * 4 + [0.3] * 4   # each staged file's four crops, once


@pytest.mark.parametrize("per_file", [1, 3])
def test_staging_decompressed_gives_the_network_the_gzip_originals_values(tmp_path, tmp_path_factory, per_file):
    write_tfrecords(tmp_path / "train", make_samples(6, 8), per_file, gzip=True)
    write_tfrecords(tmp_path / "validation", make_samples(6, 9), per_file, gzip=True)
    copied, inflated = tmp_path_factory.mktemp("stage-copied"), tmp_path_factory.mktemp("stage-inflated")
    plain = build_datasets(config(tmp_path, compression="gzip", samples_per_file=per_file, stage_dir=str(copied)), Distributed())
    staged = build_datasets(config(tmp_path, compression="gzip", samples_per_file=per_file, stage_dir=str(inflated), stage_decompress=True),
                            Distributed())
    # MLPerf's layout is staged as raw samples: each record's x bytes, then its y as float32, in file order
    # (read here from the originals with TensorFlow's own reader and parser).
    for original in sorted((tmp_path / "train").glob("*.tfrecord.gz")):
        copy = inflated / "rank-0" / (original.name.removesuffix(".gz") + ".raw")
        expected = b""
        for record in tf.data.TFRecordDataset(str(original), compression_type="GZIP"):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            expected += feature["x"].bytes_list.value[0] + np.asarray(feature["y"].float_list.value, "<f4").tobytes()
        assert copy.read_bytes() == expected
    manifest = json.loads((inflated / "rank-0" / ".hpc-dl-suite-staged.json").read_text())["files"]
    assert all(entry["decompressed"] and entry["format"] == "cosmoflow-raw-v1" for entry in manifest.values())
    # Each epoch gives the network the same samples as the staged GZIP copies (each once; the raw reader
    # shuffles samples, not files, so the order differs).
    def epoch(datasets, e):
        pairs = [(x, y) for xb, yb in datasets.train_epoch(e) for x, y in zip(xb.numpy(), yb.numpy())]
        return sorted(pairs, key=lambda pair: tuple(pair[1]))
    assert plain.steps_per_epoch == staged.steps_per_epoch
    for e in (0, 1):
        got, want = epoch(staged, e), epoch(plain, e)
        assert len(got) == len(want) == 6
        for (x1, y1), (x2, y2) in zip(got, want):
            np.testing.assert_array_equal(x1, x2)
            np.testing.assert_array_equal(y1, y2)
    # Staged again: reused, not rewritten; staged copied instead: replaced by copies.
    before = {p.name: p.stat().st_mtime_ns for p in (inflated / "rank-0").glob("*.raw")}
    build_datasets(config(tmp_path, compression="gzip", samples_per_file=per_file, stage_dir=str(inflated), stage_decompress=True), Distributed())
    assert before == {p.name: p.stat().st_mtime_ns for p in (inflated / "rank-0").glob("*.raw")}


def test_a_truncated_gzip_file_is_named_when_staging_inflates_it(tmp_path, tmp_path_factory):
    write_tfrecords(tmp_path / "train", make_samples(4, 8), gzip=True)
    write_tfrecords(tmp_path / "validation", make_samples(2, 9), gzip=True)
    victim = tmp_path / "train" / "part_0002.tfrecord.gz"
    victim.write_bytes(victim.read_bytes()[:-20])   # the GZIP trailer and some data gone
    cfg = config(tmp_path, compression="gzip", stage_dir=str(tmp_path_factory.mktemp("stage")),
                 stage_decompress=True, on_bad_file="fail")
    with pytest.raises(DataError, match=rf"{victim}: .*(corrupt|truncated)"):
        build_datasets(cfg, Distributed())


def test_a_record_damaged_inside_a_sound_gzip_stream_is_named_when_staged_as_raw_samples(tmp_path, tmp_path_factory):
    """The GZIP stream is whole (its own CRC is of the damaged bytes) but a record's payload no longer matches
    its TFRecord checksum: staging names the file and the record instead of writing a wrong sample."""
    import gzip as gz

    write_tfrecords(tmp_path / "train", make_samples(4, 8), gzip=True)
    write_tfrecords(tmp_path / "validation", make_samples(2, 9), gzip=True)
    victim = tmp_path / "train" / "part_0002.tfrecord.gz"
    inflated = bytearray(gz.decompress(victim.read_bytes()))
    inflated[100] ^= 0xFF                                  # inside the first record's payload
    victim.write_bytes(gz.compress(bytes(inflated)))
    cfg = config(tmp_path, compression="gzip", stage_dir=str(tmp_path_factory.mktemp("stage")), stage_decompress=True)
    with pytest.raises(DataError, match=rf"{victim}: corrupt TFRecord file \(bad data checksum of record 0\)"):
        build_datasets(cfg, Distributed())


def test_stage_decompress_needs_gzip_tfrecords_and_a_stage_dir(tmp_path):
    with pytest.raises(Exception, match="data.stage_decompress needs data.stage_dir"):
        config(tmp_path, compression="none", stage_dir=str(tmp_path / "s"), stage_decompress=True)


@pytest.mark.parametrize("shape, dtype", [((6, 6, 6, 4), np.int16), ((6, 6, 6, 1), np.int16),
                                          ((6, 6, 6, 3), np.int16), ((6, 6, 6, 2), np.float32),
                                          ((4, 6, 8, 4), np.int16)])
def test_augmentation_is_flips_then_a_permutation(shape, dtype):
    # Against numpy slicing and transposes; the voxel-as-one-word view must not change a value.
    x = np.random.default_rng(6).integers(-1000, 1000, size=shape).astype(dtype)
    if shape[-1] == 4 and dtype == np.int16:
        # The last channel is the high half of a voxel's float64 view: make every kind of float64 bit pattern
        # appear (quiet and signalling NaNs, infinities, subnormals, zeros of either sign, normals).
        high = np.array([0x7FF8, 0x7FF4, 0x7FF0, -16, -8, -1, 0, 1, 15, -32768, -32753, 0x3FF0, 100], np.int64)
        x[..., 3] = np.resize(high, x[..., 3].size).reshape(x[..., 3].shape).astype(np.int16)
        x[::2, ..., 0:3] = 0           # with zero low halves: exact infinities and signed zeros
    permutations = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
    outcomes = set()
    for s in range(16):
        seed = tf.constant([s, 7], tf.int64)
        flips = (tf.random.stateless_uniform([3], seed=seed) < 0.5).numpy()
        expected = x[tuple(slice(None, None, -1) if f else slice(None) for f in flips)]
        choice = int(tf.random.stateless_uniform([], seed=seed + 1, maxval=6, dtype=tf.int32))
        if len(set(shape[:3])) == 1:
            expected = np.transpose(expected, permutations[choice] + [3])
        got = augment(tf.constant(x), seed)
        assert got.shape == shape
        np.testing.assert_array_equal(got.numpy(), expected)
        outcomes.add((tuple(flips), choice))
    assert len(outcomes) > 8  # the seeds reach many flip/permutation combinations


def test_batch_of_one_equals_batches(tmp_path):
    samples = make_samples(4, 3)
    write_tfrecords(tmp_path / "train", samples)
    write_tfrecords(tmp_path / "validation", samples)
    ones = build_datasets(config(tmp_path, batch_size=1), Distributed())
    x, y = next(iter(ones.validation))
    assert x.shape == (1, *SHAPE) and y.shape == (1, 4)
    np.testing.assert_allclose(x.numpy()[0], np.log1p(samples[0][0].astype(np.float32)), rtol=1e-6)
    np.testing.assert_array_equal(y.numpy()[0], samples[0][1])


def test_batched_normalisation_divides_each_sample_by_its_own_mean(tmp_path):
    samples = make_samples(4, 4)
    write_tfrecords(tmp_path / "train", samples)
    write_tfrecords(tmp_path / "validation", samples)
    datasets = build_datasets(config(tmp_path, apply_log=False), Distributed())
    x, _ = next(iter(datasets.validation))
    for i in range(2):
        volume = samples[i][0].astype(np.float64)
        np.testing.assert_allclose(x.numpy()[i], volume / volume.mean(), rtol=1e-5)


def write_hdf5_volumes(directory, samples):
    directory.mkdir(parents=True)
    for i, (x, y) in enumerate(samples):
        with h5py.File(directory / f"univ_{i}.h5", "w") as f:
            f["full"], f["unitPar"] = x, y


@pytest.mark.parametrize("case", ["nan_target", "negative"])
@pytest.mark.parametrize("file_format", ["tfrecord", "hdf5"])
def test_bad_values_are_named_by_file_as_they_are_read(tmp_path, case, file_format):
    from common.errors import data_error_from_pipeline

    samples = make_samples(4, 12)
    x, y = samples[2]
    if case == "nan_target":
        y[1] = np.nan
    else:
        x[3, 4, 5, 1] = -3
    write = write_tfrecords if file_format == "tfrecord" else write_hdf5_volumes
    write(tmp_path / "train", samples)
    write(tmp_path / "validation", make_samples(2, 13))
    victim = tmp_path / "train" / ("part_0002.tfrecord" if file_format == "tfrecord" else "univ_2.h5")
    datasets = build_datasets(config(tmp_path, format=file_format), Distributed())
    with pytest.raises(tf.errors.OpError) as raised:
        for _ in datasets.train_epoch(0):
            pass
    error = data_error_from_pipeline(raised.value)
    message = {"nan_target": {"tfrecord": "'y' holds NaN or Inf", "hdf5": "'unitPar' holds NaN or Inf"}[file_format],
               "negative": "negative particle counts (lowest -3)"}[case]
    assert error is not None and str(error).startswith(f"{victim}: ") and message in str(error)
