"""The mock-universe generator against the physics it claims."""

import numpy as np
import pytest

from conftest import REPO
from cosmoflow.config import MockSection
from cosmoflow.mock import (cosmology_for, gaussian_random_field_k, generate_dataset, make_universe,
                            measure_power_spectrum, normalise_targets, zeldovich_counts)

PLANCK = np.array([0.31, 0.81, 0.965, 67.7])


def test_gaussian_field_follows_input_power_spectrum():
    cosmo = cosmology_for(PLANCK)
    power = lambda k: cosmo.matterPowerSpectrum(k, z=0.0)
    n, box = 64, 300.0
    ratios = []
    for seed in range(3):
        delta_k = gaussian_random_field_k(n, box, power, np.random.default_rng(seed))
        delta = np.fft.irfftn(delta_k, s=(n,) * 3, axes=(0, 1, 2))
        k, measured, modes = measure_power_spectrum(delta, box, n_bins=12)
        ratios.append(measured / power(k))
    ratio = np.mean(ratios, axis=0)
    # Each bin averages >= hundreds of modes x 3 realisations, except the first few.
    well_sampled = modes > 300
    assert well_sampled.sum() >= 9
    np.testing.assert_allclose(ratio[well_sampled], 1.0, atol=0.08)
    # And the amplitude is sigma_8's: doubling sigma_8 quadruples the spectrum.
    cosmo2 = cosmology_for(PLANCK * [1, 2, 1, 1])
    assert cosmo2.matterPowerSpectrum(0.1) / cosmo.matterPowerSpectrum(0.1) == pytest.approx(4.0, rel=1e-3)


def test_zeldovich_counts_conserve_particles_and_grow():
    mock = MockSection(box_size_mpc_h=128.0)
    counts = make_universe(PLANCK, 16, mock, np.random.default_rng(0))
    assert counts.shape == (16, 16, 16, 4) and counts.dtype == np.int16
    lattice = 16 * mock.particles_per_voxel_side
    np.testing.assert_array_equal(counts.sum(axis=(0, 1, 2)), lattice ** 3)
    spread = counts.reshape(-1, 4).std(axis=0)
    assert np.all(np.diff(spread) > 0), spread   # structure grows from z=3 to z=0


def test_zero_growth_is_the_uniform_lattice():
    delta_k = gaussian_random_field_k(16, 64.0, lambda k: np.ones_like(k), np.random.default_rng(1))
    counts = zeldovich_counts(delta_k, lattice=16, box_size=64.0, grid=8, growth=np.array([0.0]))
    np.testing.assert_array_equal(counts[..., 0], 8)


def test_higher_sigma8_means_more_clustering():
    mock = MockSection(box_size_mpc_h=128.0)
    low = make_universe(PLANCK * [1, 0.8, 1, 1], 16, mock, np.random.default_rng(3))
    high = make_universe(PLANCK * [1, 1.2, 1, 1], 16, mock, np.random.default_rng(3))
    assert high[..., 3].std() > 1.2 * low[..., 3].std()


def test_targets_normalised_and_generation_reproducible(tmp_path):
    mock = MockSection(box_size_mpc_h=64.0, seed=11)
    lo = normalise_targets(np.array([r[0] for r in (mock.omega_m_range, mock.sigma_8_range, mock.n_s_range, mock.h0_range)]), mock)
    np.testing.assert_allclose(lo, -1.0)
    first = generate_dataset(tmp_path / "a", 3, 1, 8, mock, progress=False)
    second = generate_dataset(tmp_path / "b", 3, 1, 8, mock, file_format="hdf5", progress=False)
    assert not (tmp_path / "a.partial").exists()
    import h5py
    import tensorflow as tf
    record = next(iter(tf.data.TFRecordDataset(str(sorted((first / "train").iterdir())[1]))))
    example = tf.train.Example.FromString(record.numpy())
    x = np.frombuffer(example.features.feature["x"].bytes_list.value[0], np.int16).reshape(8, 8, 8, 4)
    with h5py.File(sorted((second / "train").iterdir())[1]) as f:
        np.testing.assert_array_equal(f["full"][:], x)   # same seed, same universe, either format
        np.testing.assert_allclose(f["unitPar"][:], example.features.feature["y"].float_list.value, rtol=1e-6)
        assert np.all(np.abs(f["unitPar"][:]) <= 1.0)


def test_parallel_generation_writes_the_serial_files(tmp_path):
    mock = MockSection(box_size_mpc_h=64.0, seed=5)
    serial = generate_dataset(tmp_path / "serial", 5, 2, 8, mock, progress=False, workers=1)
    parallel = generate_dataset(tmp_path / "parallel", 5, 2, 8, mock, progress=False, workers=2)
    names = sorted(str(p.relative_to(serial)) for p in serial.rglob("*") if p.is_file())
    assert len(names) == 7
    assert names == sorted(str(p.relative_to(parallel)) for p in parallel.rglob("*") if p.is_file())
    for name in names:
        assert (serial / name).read_bytes() == (parallel / name).read_bytes(), name


def test_progress_off_a_terminal_is_a_few_lines(tmp_path):
    import io

    from common.console.progress import Progress

    stream = io.StringIO()  # not a TTY, like a CI log or a SLURM output file
    with Progress(640, "mock train", "samples", stream=stream) as bar:
        for _ in range(640):
            bar.update()
    lines = stream.getvalue().splitlines()
    assert lines == [f"mock train: {n}/640 samples ({s})" for n, s in
                     zip((160, 320, 480, 640), [line.rsplit("(", 1)[1][:-1] for line in lines])]
    assert "\r" not in stream.getvalue()


def test_the_old_validation_count_names_are_read_with_a_warning(caplog, tmp_path):
    from common.config import load_config, validate
    from common.errors import ConfigError
    from common.errors import UserInputError
    from cosmoflow.config import CosmoflowConfig
    from cosmoflow.mock import build_parser, main

    with caplog.at_level("WARNING", logger="common.config"):
        cfg = validate(CosmoflowConfig, {"data": {"data_dir": "d", "mock": {"n_valid": 7}}}, "test")
    assert cfg.data.mock.n_validation == 7 and "data.mock.n_valid is deprecated" in caplog.text
    assert build_parser().parse_args(["--n-valid", "3"]).n_validation == 3
    assert build_parser().parse_args(["--n-validation", "4"]).n_validation == 4
    assert build_parser().parse_args(["--n-val", "5"]).n_validation == 5   # an abbreviation, as before the rename
    caplog.clear()
    with caplog.at_level("WARNING", logger="cosmoflow.mock"), pytest.raises(UserInputError, match="--gzip"):
        main(["--n-valid", "3", "--format", "hdf5", "--gzip"])   # refused after the warning: nothing written
    assert "--n-valid is deprecated" in caplog.text
    # Both names: refused (argparse alone takes the last), whichever comes first and however written.
    for argv in (["--n-valid", "3", "--n-validation", "4"], ["--n-validation=4", "--n-valid=3"],
                 ["--n-valid", "3", "--n-validat", "4"]):
        with pytest.raises(UserInputError, match="give only --n-validation"):
            main([*argv, "--out", "nowhere-written"])
    # A --set of either spelling replaces the config file's count under the other (the file giving both is refused).
    demo = str(REPO / "configs/cosmoflow/demo.yaml")   # (it says data.mock.n_validation)
    assert load_config(CosmoflowConfig, demo, ["data.mock.n_valid=5"]).data.mock.n_validation == 5
    old = tmp_path / "old.yaml"
    old.write_text("data: {data_dir: d, n_valid: 3, mock: {n_valid: 2}}\n")
    cfg = load_config(CosmoflowConfig, old, ["data.n_validation=4", "data.mock.n_validation=6"])
    assert (cfg.data.n_validation, cfg.data.mock.n_validation) == (4, 6)
    both = tmp_path / "both.yaml"
    both.write_text("data: {data_dir: d, n_valid: 3, n_validation: 4}\n")
    with pytest.raises(ConfigError, match="give only data.n_validation"):
        load_config(CosmoflowConfig, both)
