"""CosmoFlow's and the HEP CNN's splits on the engine's epoch (common/loop/epochs.py), on files written here
in the real formats with TensorFlow's and h5py's own writers: the evaluation walk is every sample once in file
order (read back with tf.train.Example and h5py as the reference), two ranks' shares of a training epoch are
disjoint and cover the split, and the count and batch errors name the key and the folder."""

import h5py
import numpy as np
import pytest
import tensorflow as tf

from common.config import validate
from common.distributed import Distributed
from common.errors import ConfigError, DataError
from common.loop import epochs
from cosmoflow.config import CosmoflowConfig
from hep_cnn.config import HepConfig

SHAPE = (4, 4, 4, 2)
IMAGE = 8


def rank(size: int, index: int) -> Distributed:
    """One rank of ``size`` (the collectives stay identities: what the datasets need of it)."""
    dist = Distributed()
    dist.size, dist.rank = size, index
    return dist


# -- CosmoFlow ---------------------------------------------------------------------------

def cosmo_config(data_dir, **data):
    raw = {"data": {"data_dir": str(data_dir), "sample_shape": list(SHAPE), "batch_size": 2, "augment": False,
                    "apply_log": False, **data}}
    return validate(CosmoflowConfig, raw, "test")


def write_cosmo_tfrecords(directory, n, per_file, seed):
    """MLPerf's layout (x int16 bytes, y 4 floats), ``per_file`` records a file; the y of every sample differ."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for start in range(0, n, per_file):
        with tf.io.TFRecordWriter(str(directory / f"univ_{start:04d}.tfrecord")) as writer:
            for _ in range(min(per_file, n - start)):
                x, y = rng.integers(1, 40, SHAPE).astype("<i2"), rng.uniform(-1, 1, 4).astype(np.float32)
                feature = {"x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.tobytes()])),
                           "y": tf.train.Feature(float_list=tf.train.FloatList(value=y))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def write_cosmo_hdf5(directory, n, seed):
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        with h5py.File(directory / f"univ_{i:04d}.hdf5", "w") as f:
            f["x"], f["y"] = rng.integers(1, 40, SHAPE).astype(np.int16), rng.uniform(-1, 1, 4).astype(np.float32)


def tfrecord_reference(directory):
    """(x, y) of every record, files in name order, parsed with tf.train.Example (not the suite's parser)."""
    samples = []
    for path in sorted(directory.glob("*.tfrecord")):
        for record in tf.data.TFRecordDataset(str(path)):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            samples.append((np.frombuffer(feature["x"].bytes_list.value[0], "<i2").reshape(SHAPE),
                            np.array(feature["y"].float_list.value, np.float32)))
    return samples


def hdf5_reference(directory):
    samples = []
    for path in sorted(directory.glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            samples.append((f["x"][()], f["y"][()]))
    return samples


@pytest.mark.parametrize("file_format", ["tfrecord", "hdf5"])
def test_cosmoflow_evaluation_walk_is_every_sample_once_in_file_order(tmp_path, file_format):
    from cosmoflow.data import evaluation_dataset, split

    if file_format == "tfrecord":   # 9 samples in files of 3: records of several files, a short last batch
        write_cosmo_tfrecords(tmp_path / "validation", 9, 3, seed=1)
        reference = tfrecord_reference(tmp_path / "validation")
        cfg = cosmo_config(tmp_path, samples_per_file=3, n_validation=4)
    else:
        write_cosmo_hdf5(tmp_path / "validation", 9, seed=1)
        reference = hdf5_reference(tmp_path / "validation")
        cfg = cosmo_config(tmp_path, format="hdf5", n_validation=4)
    samples = split(cfg, "validation", Distributed())
    assert samples.count == 9 and samples.where == f"{tmp_path}/validation"   # the walk ignores data.n_validation
    dataset, count = evaluation_dataset(cfg, "validation")
    batches = [(x.numpy(), y.numpy()) for x, y in dataset]
    assert count == 9 and [len(y) for _, y in batches] == [2, 2, 2, 2, 1]
    xs, ys = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    # apply_log false: each volume divided by its mean, in float32 (the division the pipeline does)
    expected_x = [x.astype(np.float32) / np.float32(x.astype(np.float32).mean()) for x, _ in reference]
    np.testing.assert_allclose(xs, np.stack(expected_x), rtol=1e-6)
    np.testing.assert_array_equal(ys, np.stack([y for _, y in reference]))


@pytest.mark.parametrize("file_format, per_file", [("tfrecord", 1), ("tfrecord", 4), ("hdf5", 1)])
def test_cosmoflow_two_ranks_train_on_disjoint_shares_of_the_split(tmp_path, file_format, per_file):
    """16 samples, 2 ranks, batch 2: each rank's epoch is 4 steps; the two together are the split, once
    (files sharded, with one record a file and with 4; (file, crop) pairs sharded for HDF5)."""
    from cosmoflow.data import build_datasets

    if file_format == "tfrecord":
        write_cosmo_tfrecords(tmp_path / "train", 16, per_file, seed=2)
        write_cosmo_tfrecords(tmp_path / "validation", 4, per_file, seed=3)
        written = {tuple(y) for _, y in tfrecord_reference(tmp_path / "train")}
        cfg = cosmo_config(tmp_path, samples_per_file=per_file)
    else:
        write_cosmo_hdf5(tmp_path / "train", 16, seed=2)
        write_cosmo_hdf5(tmp_path / "validation", 4, seed=3)
        written = {tuple(y) for _, y in hdf5_reference(tmp_path / "train")}
        cfg = cosmo_config(tmp_path, format="hdf5")
    for epoch in (0, 1):
        shares = []
        for index in (0, 1):
            datasets = build_datasets(cfg, rank(2, index))
            assert (datasets.steps_per_epoch, datasets.global_batch_size) == (4, 4)
            shares.append([tuple(row) for _, y in datasets.train_epoch(epoch) for row in y.numpy()])
        assert [len(share) for share in shares] == [8, 8]
        assert not set(shares[0]) & set(shares[1])
        assert set(shares[0]) | set(shares[1]) == written


def test_cosmoflow_count_and_batch_errors_name_the_key_and_the_folder(tmp_path):
    from cosmoflow.data import build_datasets

    write_cosmo_tfrecords(tmp_path / "train", 6, 1, seed=4)
    write_cosmo_tfrecords(tmp_path / "validation", 3, 1, seed=5)
    with pytest.raises(DataError) as raised:
        build_datasets(cosmo_config(tmp_path, n_train=9), Distributed())
    assert str(raised.value) == f"data.n_train=9 but only 6 samples are present in {tmp_path / 'train'}"
    with pytest.raises(DataError) as raised:
        build_datasets(cosmo_config(tmp_path, n_validation=5), Distributed())
    assert str(raised.value) == f"data.n_validation=5 but only 3 samples are present in {tmp_path / 'validation'}"
    with pytest.raises(DataError) as raised:   # validation: 3 samples, 2 ranks of 2
        build_datasets(cosmo_config(tmp_path), rank(2, 1))
    assert str(raised.value) == (f"{tmp_path}/validation: 3 samples cannot fill one batch of 2 on each of 2 ranks "
                                 "(lower data.batch_size or add data)")


def test_cosmoflow_old_validation_count_key_is_read_with_a_warning(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="common.config"):
        cfg = cosmo_config(tmp_path, n_valid=5)
    assert cfg.data.n_validation == 5 and "data.n_valid is deprecated" in caplog.text
    with pytest.raises(ConfigError, match="data.n_valid is the old name of data.n_validation"):
        cosmo_config(tmp_path, n_valid=5, n_validation=4)


def test_cosmoflow_batch_error_comes_before_staging_copies_anything(tmp_path):
    from cosmoflow.data import build_datasets

    write_cosmo_tfrecords(tmp_path / "data" / "train", 3, 1, seed=6)
    write_cosmo_tfrecords(tmp_path / "data" / "validation", 4, 1, seed=7)
    stage = tmp_path / "stage"
    with pytest.raises(DataError, match="train: 3 samples cannot fill one batch of 4 on each of 1 ranks"):
        build_datasets(cosmo_config(tmp_path / "data", batch_size=4, stage_dir=str(stage)), Distributed())
    assert not stage.exists()


# -- HEP CNN ------------------------------------------------------------------------------

def write_hep(path, n, seed):
    """The all_events layout with h5py; every event's weight differs (what identifies it)."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        group = f.create_group("all_events")
        for key in ("hist", "histEM", "histtrack"):
            group[key] = rng.exponential(1.0, (n, IMAGE, IMAGE)).astype(np.float32)
        group["y"], group["passSR"] = rng.integers(0, 2, n), rng.integers(0, 2, n)
        group["weight"] = rng.uniform(0.5, 4.0, n).astype(np.float32)


def hep_config(tmp_path, **data):
    raw = {"data": {"data_dir": str(tmp_path / "data"), "derived_dir": str(tmp_path / "derived"),
                    "image_size": IMAGE, "batch_size": 2, "chunk_size": 3, **data},
           "loss": {"weighted": True}}
    return validate(HepConfig, raw, "test")


@pytest.fixture
def hep_data(tmp_path):
    from hep_cnn.data import write_maxima

    (tmp_path / "data").mkdir()
    for name, n, seed in (("train_0000", 7, 0), ("train_0001", 5, 1), ("val_0000", 4, 2), ("test_0000", 5, 3),
                          ("test_0001", 4, 4)):
        write_hep(tmp_path / "data" / f"{name}.h5", n, seed)
    write_maxima(hep_config(tmp_path))
    return tmp_path


def test_hep_evaluation_walk_is_every_event_once_in_file_order(hep_data):
    from hep_cnn.data import evaluation_events, load_maxima, split

    cfg = hep_config(hep_data, weight_normalization="max", n_train=4)   # the walk takes raw weights, every event
    assert split(cfg, "test", Distributed()).count == 9
    batches = [tuple(t.numpy() for t in batch) for batch in evaluation_events(cfg, "test")]
    assert [len(b[1]) for b in batches] == [2, 2, 2, 2, 1]
    images, labels, weights, pass_sr = (np.concatenate(column) for column in zip(*batches))
    scale = np.array(load_maxima(cfg)["channel_max"], np.float32)
    expected = {"images": [], "y": [], "weight": [], "passSR": []}
    for name in ("test_0000", "test_0001"):
        with h5py.File(hep_data / "data" / f"{name}.h5", "r") as f:
            group = f["all_events"]
            expected["images"].append(np.stack([group[k][()] for k in ("hist", "histEM", "histtrack")], axis=-1))
            for key in ("y", "weight", "passSR"):
                expected[key].append(group[key][()])
    np.testing.assert_allclose(images, np.concatenate(expected["images"]) / scale, rtol=1e-6)
    np.testing.assert_array_equal(labels, np.concatenate(expected["y"]))
    np.testing.assert_array_equal(weights, np.concatenate(expected["weight"]))
    np.testing.assert_array_equal(pass_sr, np.concatenate(expected["passSR"]))


def test_hep_two_ranks_train_on_disjoint_shares_of_the_split(hep_data):
    """12 training events in chunks of 3 (3 + 3 + 1 and 3 + 2: 5 chunks), 2 ranks, batch 2: 3 steps each;
    each rank's epoch is 6 events of its own chunks, none on both ranks."""
    from hep_cnn.data import build_datasets

    cfg = hep_config(hep_data, shuffle_buffer=4, weight_normalization="none")   # the weight names its event
    written = set()
    for name in ("train_0000", "train_0001"):
        with h5py.File(hep_data / "data" / f"{name}.h5", "r") as f:
            written |= set(f["all_events/weight"][()].tolist())
    assert len(written) == 12
    for epoch in (0, 1):
        shares = []
        for index in (0, 1):
            datasets = build_datasets(cfg, rank(2, index))
            assert (datasets.steps_per_epoch, datasets.global_batch_size) == (3, 4)
            shares.append([float(w) for _, _, weights in datasets.train_epoch(epoch) for w in weights.numpy()])
        assert [len(share) for share in shares] == [6, 6]
        assert not set(shares[0]) & set(shares[1])
        assert set(shares[0]) | set(shares[1]) <= written


def test_hep_count_and_batch_errors_name_the_key_and_the_folder(hep_data):
    from hep_cnn.data import build_datasets, split

    data_dir = hep_data / "data"
    with pytest.raises(DataError) as raised:
        build_datasets(hep_config(hep_data, n_train=13), Distributed())
    assert str(raised.value) == f"data.n_train=13 but only 12 samples are present in {data_dir}"
    with pytest.raises(DataError) as raised:
        build_datasets(hep_config(hep_data, n_validation=5), Distributed())
    assert str(raised.value) == f"data.n_validation=5 but only 4 samples are present in {data_dir}"
    with pytest.raises(DataError) as raised:   # validation: 4 events, 2 ranks of 3
        build_datasets(hep_config(hep_data, batch_size=3), rank(2, 0))
    assert str(raised.value) == (f"{data_dir} (validation): 4 samples cannot fill one batch of 3 on each of 2 ranks "
                                 "(lower data.batch_size or add data)")
    assert epochs.steps(split(hep_config(hep_data), "test", Distributed()), 2, 2) == 2
