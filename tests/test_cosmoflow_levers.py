"""CosmoFlow's levers for the periodic mocks (issue 49): periodic padding in the network, random periodic shifts
in training, test-time averaging over the cube's symmetries in evaluate.  Each checked against numpy written
here (np.pad, np.roll, np.flip, np.transpose), not against the code's own output."""

import csv
import itertools
import json
import math
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from common.config import load_config, validate
from common.distributed import Distributed
from common.errors import ConfigError, UserInputError
from conftest import REPO, UNIT_ROUNDOFF, run_python, summation_tolerance, tiny_cosmo_overrides
from cosmoflow.config import CosmoflowConfig
from cosmoflow.data import build_datasets, random_shift, random_shift_offsets
from cosmoflow.evaluate import CUBE_SYMMETRIES, SYMMETRY_COUNTS, check_symmetries, evaluate
from cosmoflow.model import build_model, check_blocks_fit, periodic_pad
from test_cosmoflow_data import make_samples, write_tfrecords

DEMO = REPO / "configs/cosmoflow/demo.yaml"


def gamma(n: int, dtype: str = "float32") -> float:
    """Higham's gamma_n = n u / (1 - n u): a sum of n products computed in ``dtype`` is within gamma_n times
    the sum of their magnitudes of the exact one (Accuracy and Stability of Numerical Algorithms, 3.1)."""
    u = UNIT_ROUNDOFF[dtype]
    return n * u / (1 - n * u)


def wrapped_correlation(x, kernel, bias):
    """Keras' Conv3D on a periodic field, by hand: np.pad(mode="wrap") by (k - 1) // 2 before and k // 2
    after each spatial axis (where ``same`` padding puts its zeros), then every output position's sum over
    the kernel's taps and input channels, in float64.  (x: batch, X, Y, Z, C; kernel: k, k, k, C, F.)"""
    k = kernel.shape[0]
    pad = [(0, 0)] + [((k - 1) // 2, k // 2)] * 3 + [(0, 0)]
    wrapped = np.pad(x.astype(np.float64), pad, mode="wrap")
    batch, nx, ny, nz, _ = x.shape
    out = np.zeros((batch, nx, ny, nz, kernel.shape[-1]))
    for p, q, r in itertools.product(range(k), repeat=3):
        out += np.einsum("bxyzc,cf->bxyzf", wrapped[:, p:p + nx, q:q + ny, r:r + nz], kernel[p, q, r].astype(np.float64))
    return out + bias


@pytest.mark.parametrize("kernel_size", [3, 2])
def test_a_periodic_convolution_equals_numpy_wrapped_correlation(kernel_size):
    rng = np.random.default_rng(kernel_size)
    x = rng.normal(size=(2, 6, 5, 4, 3)).astype(np.float32)   # no cube: each axis wraps by its own size
    inputs = keras.Input(shape=x.shape[1:])
    padded = periodic_pad(inputs, (kernel_size - 1) // 2, kernel_size // 2, name="c")
    conv = keras.layers.Conv3D(5, kernel_size, padding="valid", name="conv")
    model = keras.Model(inputs, conv(padded))
    kernel = rng.normal(size=(kernel_size,) * 3 + (3, 5)).astype(np.float32)
    bias = rng.normal(size=5).astype(np.float32)
    conv.set_weights([kernel, bias])

    got = np.asarray(model(x))
    expected = wrapped_correlation(x, kernel, bias)
    # Each output is a float32 sum of k^3 * C products and the bias: within gamma_(k^3 C + 1) of the sum of
    # the terms' magnitudes (x, kernel and bias are exact float32 numbers, the reference float64).
    magnitudes = wrapped_correlation(np.abs(x), np.abs(kernel), np.abs(bias))
    terms = kernel_size ** 3 * 3 + 1
    assert got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= gamma(terms) * magnitudes)
    # Same padding's zeros give other values at the faces: the wrap is what is tested.
    same = keras.layers.Conv3D(5, kernel_size, padding="same")
    same.build(x.shape)
    same.set_weights([kernel, bias])
    assert np.max(np.abs(np.asarray(same(x)) - expected)) > 100 * gamma(terms) * magnitudes.max()


def cosmo_config(data_dir="unused", **model):
    raw = {"data": {"data_dir": str(data_dir), "sample_shape": [16, 16, 16, 4], "batch_size": 2},
           "model": {"conv_blocks": 2, "base_filters": 4, "dense_units": [8], "dropout": 0.0, "pooling": "average",
                     **model},
           "train": {"precision": "fp32"}}
    return validate(CosmoflowConfig, raw, "test")


@pytest.mark.parametrize("periodic", [True, False])
def test_an_average_pooled_periodic_network_is_invariant_under_periodic_shifts(periodic):
    """Conv (periodic), LeakyReLU, max pooling by 2 and the global average all commute with a shift by a multiple
    of the pooling factor 2^2 = 4: the output is the same to round-off.  Zero padding breaks it at the faces."""
    keras.utils.set_random_seed(3)
    model = build_model(cosmo_config(periodic_padding=periodic))
    x = np.log1p(np.random.default_rng(0).poisson(3.0, size=(3, 16, 16, 16, 4))).astype(np.float32)
    base = np.asarray(model(x), np.float64)
    shifted = np.asarray(model(np.roll(x, (4, 8, 12), axis=(1, 2, 3))), np.float64)
    # The shift moves positions, not the terms of one position's convolution sum; what it reorders is the global
    # average's sum over the last map's 4^3 positions: two orders of a 64-term sum, at the output's scale
    # (the tanh output times 1.2, slopes at most 1 after it).
    tolerance = summation_tolerance(64, 1.2)
    difference = np.max(np.abs(shifted - base))
    if periodic:
        assert difference <= tolerance
    else:
        assert difference > 10 * tolerance


def test_periodic_padding_refuses_what_cannot_be_periodic(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {data_dir: d}\nmodel: {padding: valid, periodic_padding: true}\n")
    with pytest.raises(ConfigError, match="model.periodic_padding needs model.padding: same"):
        load_config(CosmoflowConfig, path)
    # 24 = 2^3 x 3: the fourth block would pool a volume of 3 voxels, which 2 does not divide.
    cfg = cosmo_config(conv_blocks=4, periodic_padding=True)
    cfg.data.sample_shape = (24, 24, 24, 4)
    with pytest.raises(ConfigError, match="model.periodic_padding: block 4 .*data.sample_shape divisible by 16"):
        check_blocks_fit(cfg)
    cfg.model.periodic_padding = False
    check_blocks_fit(cfg)   # zero padding floors the odd size away, as before


def test_random_shift_rolls_each_volume_by_its_drawn_offsets():
    # Voxel (i, j, k) holds its own coordinates: where the origin went tells the offset, independently of the
    # code's own account of it.
    shape = (8, 6, 4)
    grid = np.stack(np.meshgrid(*map(np.arange, shape), indexing="ij"), axis=-1)
    x = np.concatenate([grid, np.random.default_rng(1).integers(0, 99, shape + (1,))], axis=-1).astype(np.int16)
    seen = [set() for _ in shape]
    for s in range(40):
        seed = tf.constant([s, 11], tf.int64)
        got = random_shift(tf.constant(x), seed).numpy()
        offsets = [(-int(got[0, 0, 0, axis])) % size for axis, size in enumerate(shape)]
        np.testing.assert_array_equal(got, np.roll(x, offsets, axis=(0, 1, 2)))
        assert offsets == random_shift_offsets(seed, shape).numpy().tolist()   # the drawn offsets
        np.testing.assert_array_equal(random_shift(tf.constant(x), seed).numpy(), got)   # same seed, same shift
        for axis, offset in enumerate(offsets):
            seen[axis].add(offset)
    assert [len(s) for s in seen] == list(shape)   # 40 draws reach every offset of each axis


def _training_batches(data_dir, epoch, **data):
    raw = {"data": {"data_dir": str(data_dir), "sample_shape": [8, 8, 8, 4], "batch_size": 2, **data},
           "train": {"precision": "fp32", "seed": 5}}
    datasets = build_datasets(validate(CosmoflowConfig, raw, "test"), Distributed())
    return [(x.numpy(), y.numpy()) for x, y in datasets.train_epoch(epoch)]


def _circular_offset(moved, original):
    """The roll that takes ``original`` to ``moved`` (both X, Y, Z), by the peak of their circular
    cross-correlation (numpy's FFT): found without the pipeline's seeds."""
    correlation = np.fft.ifftn(np.fft.fftn(moved) * np.conj(np.fft.fftn(original))).real
    return np.unravel_index(np.argmax(correlation), correlation.shape)


@pytest.mark.parametrize("augment", [False, True])
def test_training_batches_are_periodic_shifts_of_the_samples(tmp_path, augment):
    samples = make_samples(8, 4)
    for split in ("train", "validation"):
        write_tfrecords(tmp_path / split, samples)
    originals = {tuple(np.round(y, 6)): x for x, y in samples}
    batches = _training_batches(tmp_path, 0, random_shift=True, augment=augment)
    shifts = []
    for x_batch, y_batch in batches:
        for normalised, y in zip(x_batch, y_batch):
            x = np.rint(np.expm1(normalised)).astype(np.int16)   # the counts back from log1p (below 50: exact)
            original = originals[tuple(np.round(y, 6))]
            if augment:   # undo nothing: one of the 48 symmetries of the original, then a roll
                candidates = [np.transpose(np.flip(original, flipped), (*permutation, 3))
                              for flipped, permutation in CUBE_SYMMETRIES]
            else:
                candidates = [original]
            matches = []
            for candidate in candidates:
                offset = _circular_offset(x.sum(-1, dtype=np.float64), candidate.sum(-1, dtype=np.float64))
                if np.array_equal(x, np.roll(candidate, offset, axis=(0, 1, 2))):
                    matches.append(offset)
            assert matches, "a training volume that is no periodic shift of its sample"
            assert x.sum(dtype=np.int64) == original.sum(dtype=np.int64)   # the counts kept
            shifts.append(tuple(int(o) for o in matches[0]))
    assert len(shifts) == 8 and len(set(shifts)) > 4   # the samples get shifts of their own
    # Deterministic given the seed; another epoch draws others for the same samples.
    again = _training_batches(tmp_path, 0, random_shift=True, augment=augment)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(batches, again))
    first, second = (_by_sample(b) for b in (batches, _training_batches(tmp_path, 1, random_shift=True,
                                                                         augment=augment)))
    assert first.keys() == second.keys() and any(not np.array_equal(first[k], second[k]) for k in first)


def _by_sample(batches) -> dict:
    """{a sample's targets: its training volume} over an epoch's batches."""
    return {tuple(np.round(y, 6)): x for x_batch, y_batch in batches for x, y in zip(x_batch, y_batch)}


def test_symmetry_counts_are_groups_and_cover_the_cube():
    """Each count the option takes is a group under composition (so the average is invariant under it), and 48
    are the cube's 48 rotations and reflections, as np.flip and np.transpose give them."""
    cube = np.random.default_rng(2).normal(size=(3, 3, 3))

    def apply(symmetry, volume):
        flipped, permutation = symmetry
        return np.transpose(np.flip(volume, flipped), permutation)

    def key(volume):
        return volume.round(12).tobytes()

    everything = {key(np.transpose(np.flip(cube, [a for a in range(3) if f[a]]), p))
                  for f in itertools.product((0, 1), repeat=3) for p in itertools.permutations(range(3))}
    assert len(everything) == 48 and {key(apply(s, cube)) for s in CUBE_SYMMETRIES} == everything
    for count in SYMMETRY_COUNTS:
        images = {key(apply(s, cube)) for s in CUBE_SYMMETRIES[:count]}
        assert len(images) == count
        composed = {key(apply(a, apply(b, cube))) for a in CUBE_SYMMETRIES[:count] for b in CUBE_SYMMETRIES[:count]}
        assert composed == images, count


def test_symmetries_beyond_the_flips_need_a_cube():
    cfg = cosmo_config()
    check_symmetries(cfg, 48)
    cfg.data.sample_shape = (16, 16, 8, 4)
    check_symmetries(cfg, 8)
    with pytest.raises(UserInputError, match=r"--symmetries 16: .*\[16, 16, 8\]\) are no cube.*--symmetries 8"):
        check_symmetries(cfg, 16)
    with pytest.raises(UserInputError, match="--symmetries 3: expected one of 1, 2, 4, 8, 16, 48"):
        check_symmetries(cfg, 3)


ALL_LEVERS = ["--set", "model.periodic_padding=true", "--set", "data.random_shift=true", "--set", "data.augment=true",
              "--set", "model.pooling=average", "--set", "model.batch_norm=true"]


@pytest.fixture(scope="module")
def levers_run(tiny_cosmo_data, tmp_path_factory):
    """A tiny fixed-seed run with every lever on, evaluated with --symmetries 48 by the command."""
    run_dir = tmp_path_factory.mktemp("levers") / "run"
    run_python(["-m", "cosmoflow.train", "--config", str(DEMO), *tiny_cosmo_overrides(tiny_cosmo_data, epochs=2),
                *ALL_LEVERS, "--output-dir", str(run_dir)])
    evaluated = run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(run_dir), "--symmetries", "48"])
    return run_dir, evaluated


def test_a_run_with_every_lever_trains_and_evaluates(levers_run):
    run_dir, evaluated = levers_run
    with open(run_dir / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and all(math.isfinite(float(row[k])) for row in rows for k in ("loss", "val_loss"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    average = metrics["test_time_average"]
    assert average["symmetries"] == 48 and set(average["mae"]) == set(metrics["mae"])
    assert "averaged over 48 symmetries of the cube" in evaluated.stdout


def _validation_volumes(cfg):
    """The validation split's volumes as the network takes them (log1p of the counts) and their targets, read
    with TensorFlow's record reader and tf.train.Example, not the suite's pipeline."""
    files = sorted((pathlib.Path(cfg.data.data_dir) / "validation").glob("*.tfrecord"))
    volumes, targets = [], []
    for record in tf.data.TFRecordDataset([str(f) for f in files]):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        counts = np.frombuffer(feature["x"].bytes_list.value[0], "<i2").reshape(cfg.data.sample_shape)
        volumes.append(np.log1p(counts.astype(np.float32)))
        targets.append(np.asarray(feature["y"].float_list.value, np.float32))
    return np.stack(volumes), np.stack(targets)


def test_averaged_predictions_are_the_mean_over_the_48_transformed_volumes(levers_run):
    run_dir, _ = levers_run
    cfg = load_config(CosmoflowConfig, run_dir / "config.yaml")
    model = keras.models.load_model(run_dir / "model.keras", compile=False)
    volumes, _ = _validation_volumes(cfg)
    transformed = [np.ascontiguousarray(np.transpose(np.flip(volumes, [1 + a for a in range(3) if flips[a]]),
                                                     (0, *(1 + p for p in permutation), 4)))
                   for flips in itertools.product((0, 1), repeat=3) for permutation in itertools.permutations(range(3))]
    expected = np.mean([np.asarray(model.predict(v, batch_size=4, verbose=0), np.float64) for v in transformed],
                       axis=0)
    saved = np.load(run_dir / "predictions.npz")
    assert saved["predictions_averaged"].shape == expected.shape
    # The same network on the same float32 volumes, perhaps in other batches (another kernel order): each
    # prediction within a few units of float32 round-off of the tanh output's scale 1.2, the mean as well.
    np.testing.assert_allclose(saved["predictions_averaged"], expected, rtol=0, atol=1e-5)
    assert np.max(np.abs(saved["predictions_averaged"] - saved["predictions"])) > 1e-3   # the average is another


def symmetrised(kernel):
    """A Conv3D kernel (k, k, k, in, out) averaged over the 48 symmetries of its spatial axes: a convolution
    that commutes with every rotation and reflection of the cube."""
    images = [np.transpose(np.flip(kernel, [a for a in range(3) if flips[a]]), (*permutation, 3, 4))
              for flips in itertools.product((0, 1), repeat=3) for permutation in itertools.permutations(range(3))]
    return np.mean(images, axis=0)


def test_an_exactly_symmetric_network_averages_to_itself(levers_run, tmp_path):
    run_dir, _ = levers_run
    symmetric = tmp_path / "run"
    symmetric.mkdir()
    for name in ("config.yaml", "history.csv"):
        (symmetric / name).write_bytes((run_dir / name).read_bytes())
    model = keras.models.load_model(run_dir / "model.keras", compile=False)
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv3D):
            kernel, bias = layer.get_weights()
            layer.set_weights([symmetrised(kernel), bias])
    model.save(symmetric / "model.keras")
    metrics = evaluate(symmetric, symmetries=48)
    saved = np.load(symmetric / "predictions.npz")
    # Each transformed volume gives the same prediction up to the order of the sums (periodic convolution,
    # pooling windows that map onto each other, a global average): float32 round-off, well under 1e-5 here.
    np.testing.assert_allclose(saved["predictions_averaged"], saved["predictions"], rtol=0, atol=1e-5)
    for name, value in metrics["mae"].items():
        assert metrics["test_time_average"]["mae"][name] == pytest.approx(value, abs=1e-5)
