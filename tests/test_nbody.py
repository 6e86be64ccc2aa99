"""COLA and 2LPT mock dynamics (cosmoflow/nbody.py) against physics, not against themselves.

References, independent of the code under test: colossus' linear growth factor; Bouchet et al. 1995 (A&A 296,
575) for the second-order growth, D2 = -3/7 D1^2 Omega_m(a)^(-1/143); the analytic 2LPT solution of two crossed
plane waves; the Zel'dovich solution, exact for a plane wave until shell crossing; linear theory and its cosmic
variance at the largest scales; Takahashi et al. 2012 (ApJ 761, 152, "Revising the halofit model") for the
nonlinear power spectrum, written out below from the paper's appendix.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from cosmoflow import mock, nbody
from cosmoflow.config import MockSection

PLANCK = np.array([0.3, 0.8, 0.96, 70.0])   # Omega_m, sigma_8, n_s, H0


def linear_power():
    cosmo = mock.cosmology_for(PLANCK)
    return lambda k: cosmo.matterPowerSpectrum(k, z=0.0)


def halofit(k, p_lin, omega_m_a):
    """Takahashi et al. 2012, eqs. A4-A11 and A6's coefficients (flat, w = -1, no neutrinos): P_NL(k) for the
    linear spectrum ``p_lin`` at the output redshift, Omega_m(a) there."""
    kk = np.logspace(-4, 2, 6000)
    d2 = kk ** 3 * p_lin(kk) / (2 * np.pi ** 2)

    def moments(radius):
        y2 = (kk * radius) ** 2
        return [np.trapezoid(d2 * y2 ** i * np.exp(-y2), np.log(kk)) for i in range(3)]

    radius = np.exp(brentq(lambda lnr: np.log(moments(np.exp(lnr))[0]), np.log(1e-3), np.log(1e2)))
    s0, s1, s2 = moments(radius)
    n = -3.0 + 2.0 * s1 / s0                                     # -3 - dln sigma^2 / dln R
    c = 4.0 * s1 / s0 - 4.0 * s2 / s0 + 4.0 * (s1 / s0) ** 2      # -d^2 ln sigma^2 / dln R^2
    an = 10 ** (1.5222 + 2.8553 * n + 2.3706 * n ** 2 + 0.9903 * n ** 3 + 0.2250 * n ** 4 - 0.6038 * c)
    bn = 10 ** (-0.5642 + 0.5864 * n + 0.5716 * n ** 2 - 1.5474 * c)
    cn = 10 ** (0.3698 + 2.0404 * n + 0.8161 * n ** 2 + 0.5869 * c)
    gamma = 0.1971 - 0.0843 * n + 0.8460 * c
    alpha = abs(6.0835 + 1.3373 * n - 0.1959 * n ** 2 - 5.5274 * c)
    beta = 2.0379 - 0.7354 * n + 0.3157 * n ** 2 + 1.2490 * n ** 3 + 0.3980 * n ** 4 - 0.1682 * c
    nu = 10 ** (5.2105 + 3.6902 * n)                             # mu_n = 0
    f1, f2, f3 = omega_m_a ** -0.0307, omega_m_a ** -0.0585, omega_m_a ** 0.0743
    y = k * radius
    dl = k ** 3 * p_lin(k) / (2 * np.pi ** 2)
    quasi_linear = dl * (1 + dl) ** beta / (1 + alpha * dl) * np.exp(-y / 4 - y ** 2 / 8)
    halo = an * y ** (3 * f1) / (1 + bn * y ** f2 + (f3 * cn * y) ** (3 - gamma)) / (1 + nu / y ** 2)
    return (quasi_linear + halo) * 2 * np.pi ** 2 / k ** 3


def test_growth_factors_solve_the_growth_equations_as_published():
    """D1 as colossus computes it (integral solution, radiation off) to 1e-4; D2 as Bouchet et al.'s fit for
    Lambda models, quoted good to a fraction of a percent, to 1e-3 (measured here: 2e-4)."""
    from colossus.cosmology import cosmology

    z = np.array([0.0, 0.5, 1.5, 3.0, 9.0])
    a = 1.0 / (1.0 + z)
    for omega_m in (0.2, 0.3, 0.4):
        reference = cosmology.Cosmology(name="growth-test", flat=True, H0=70.0, Om0=omega_m, Ob0=0.049, sigma8=0.8,
                                        ns=0.96, relspecies=False, persistence="")
        background = nbody.Background(omega_m)
        d1, _, d2, _ = background.growth(a)
        np.testing.assert_allclose(d1, reference.growthFactor(z) / reference.growthFactor(0.0), rtol=1e-4)
        bouchet = -3.0 / 7.0 * d1 ** 2 * background.omega_m_of_a(a) ** (-1.0 / 143.0)
        np.testing.assert_allclose(d2, bouchet, rtol=1e-3)


def test_kick_and_drift_factors_are_the_einstein_de_sitter_integrals():
    """With Omega_m = 1, E = a^-3/2: the integral of da / (a^2 E) is 2 (sqrt a1 - sqrt a0), of da / (a^3 E)
    2 (1 / sqrt a0 - 1 / sqrt a1)."""
    background = nbody.Background(1.0)
    for a0, a1 in ((0.1, 0.19), (0.25, 0.4), (0.91, 1.0)):
        assert background.kick_factor(a0, a1) == pytest.approx(2 * (a1 ** 0.5 - a0 ** 0.5), rel=1e-10)
        assert background.drift_factor(a0, a1) == pytest.approx(2 * (a0 ** -0.5 - a1 ** -0.5), rel=1e-10)


def test_a_plain_particle_mesh_run_grows_a_linear_wave_as_linear_theory():
    """The same steps integrating the whole motion (no 2LPT frame), a wave of amplitude 0.01 from z = 9:
    its displacement at z = 3 and 0 is D1 times the initial one and its momentum a^3 E dD1/da times it, both
    from colossus (finite differences of its growth factor), within 1% (measured 0.1-0.2% with a mesh three
    times finer than the lattice and 40 steps).  The growth then comes from the kick and drift factors and
    the 3/2 Omega_m alone: a kick 10% weak grows the wave 13% less from z = 9."""
    from colossus.cosmology import cosmology

    omega_m = 0.3
    reference = cosmology.Cosmology(name="growth-test", flat=True, H0=70.0, Om0=omega_m, Ob0=0.049, sigma8=0.8,
                                    ns=0.96, relspecies=False, persistence="")

    def growth(a):
        return reference.growthFactor(1 / a - 1) / reference.growthFactor(0.0)

    n, box, amplitude = 32, 256.0, 0.01
    k = 2 * np.pi / box
    q = nbody.lattice(n, box)
    delta = (amplitude * np.cos(k * q[:, 0])).reshape(n, n, n)
    psi = -amplitude / k * np.sin(k * q[:, 0])
    snapshots = nbody.evolve(np.fft.rfftn(delta), n, box, omega_m, [3.0, 0.0], "cola", steps=40, mesh_factor=3,
                             lpt_frame=False)
    for snapshot in snapshots:
        a = snapshot.a
        e = np.sqrt(omega_m / a ** 3 + 1 - omega_m)
        momentum = a ** 3 * e * (growth(a * 1.0001) - growth(a * 0.9999)) / (0.0002 * a)
        displacement = (snapshot.positions[:, 0] - q[:, 0] + box / 2) % box - box / 2
        assert np.sum(displacement * psi) / np.sum(psi ** 2) == pytest.approx(growth(a), rel=0.01)
        assert np.sum(snapshot.momenta[:, 0] * psi) / np.sum(psi ** 2) == pytest.approx(momentum, rel=0.01)


def test_2lpt_of_two_crossed_plane_waves_is_the_analytic_solution():
    """delta_L = A (cos kx + cos ky): Psi1 = -(A / k) (sin kx, sin ky, 0); lap phi2 = phi1_xx phi1_yy
    = A^2 cos kx cos ky, so Psi2 = grad phi2 = A^2 / (2k) (sin kx cos ky, cos kx sin ky, 0)."""
    n, box, amplitude = 16, 64.0, 0.3
    k = 2 * np.pi * 2 / box
    q = nbody.lattice(n, box)
    x, y = q[:, 0], q[:, 1]
    delta = amplitude * (np.cos(k * x) + np.cos(k * y)).reshape(n, n, n)
    psi1, psi2 = nbody.lpt_displacements(np.fft.rfftn(delta), n, box)
    expected1 = -amplitude / k * np.stack([np.sin(k * x), np.sin(k * y), 0 * x], axis=1)
    expected2 = amplitude ** 2 / (2 * k) * np.stack([np.sin(k * x) * np.cos(k * y), np.cos(k * x) * np.sin(k * y),
                                                      0 * x], axis=1)
    np.testing.assert_allclose(psi1, expected1, atol=1e-12 * np.abs(expected1).max())
    np.testing.assert_allclose(psi2, expected2, atol=1e-12 * np.abs(expected2).max())


def test_the_second_order_displacement_scales_as_second_order_growth():
    """2LPT positions of one field at amplitudes A, 2A, 3A: the part quadratic in A is D2(a) Psi2, so
    [x(3A) - 3 x(A)] / [x(2A) - 2 x(A)] = 3, and its ratio between two redshifts is D2(a1) / D2(a2), taken from
    Bouchet et al.'s formula (independent of the code's growth equations)."""
    n, box = 16, 128.0
    delta_k = mock.gaussian_random_field_k(n, box, linear_power(), np.random.default_rng(3))
    redshifts = [2.0, 0.0]
    positions = {}
    for factor in (1, 2, 3):
        snapshots = nbody.evolve(factor * delta_k, n, box, PLANCK[0], redshifts, "2lpt")
        # unwrapped: the displacement from the lattice, the same for every amplitude modulo the box
        positions[factor] = [nbody.lattice(n, box) + ((s.positions - nbody.lattice(n, box) + box / 2) % box - box / 2)
                             for s in snapshots]
    second = [positions[2][i] - 2 * positions[1][i] + nbody.lattice(n, box) for i in range(2)]
    third = [positions[3][i] - 3 * positions[1][i] + 2 * nbody.lattice(n, box) for i in range(2)]
    for i in range(2):
        assert np.abs(second[i]).max() > 1e-3
        np.testing.assert_allclose(third[i], 3 * second[i], atol=1e-9 * np.abs(third[i]).max())
    background = nbody.Background(PLANCK[0])
    a = 1 / (1 + np.array(redshifts))
    d1 = background.growth(a)[0]
    bouchet = -3 / 7 * d1 ** 2 * background.omega_m_of_a(a) ** (-1 / 143)
    ratio = np.sum(second[0] * second[1]) / np.sum(second[1] ** 2)
    assert ratio == pytest.approx(bouchet[0] / bouchet[1], rel=1e-3)


@pytest.mark.parametrize("mesh_factor, amplitude, tolerance, momentum_tolerance", [
    (1, 0.01, 0.01, 0.01), (2, 0.01, 0.015, 0.03), (3, 0.01, 0.01, 0.01),
    (1, 0.6, 0.07, 0.08), (2, 0.6, 0.13, 0.15), (3, 0.6, 0.07, 0.13)])
def test_cola_follows_the_zeldovich_pancake_until_shell_crossing(mesh_factor, amplitude, tolerance,
                                                                 momentum_tolerance):
    """A plane wave of the box's size, delta_L = A cos kx: the Zel'dovich displacement is the exact solution
    until the sheets cross (D1 A = 1), and its 2LPT term is zero.  At z = 0 the COLA particles sit on it within
    ``tolerance`` of the largest displacement, their momenta within ``momentum_tolerance`` of the largest
    momentum.  In the linear regime (A = 0.01), where the PM's own linear response is subtracted: measured
    0.2-1.0% (positions), 0.4-2.3% (momenta).  At A = 0.6 (density 2.5 times the mean at the sheet) the CIC
    mesh's resolution of the sheet: with meshes 1 and 3 times finer than the lattice 5.1% and 6.4% (positions),
    7.1% and 12.6% (momenta); with the default, twice as fine, 11.9% and 14.2% (the lattice's period aliased
    by the mesh: docs/cosmoflow.md, "How the dynamics were checked")."""
    n, box = 16, 64.0
    k = 2 * np.pi / box
    q = nbody.lattice(n, box)
    delta = (amplitude * np.cos(k * q[:, 0])).reshape(n, n, n)
    snapshot = nbody.evolve(np.fft.rfftn(delta), n, box, PLANCK[0], [0.0], "cola", steps=10,
                            mesh_factor=mesh_factor)[0]
    exact = q.copy()
    exact[:, 0] -= amplitude / k * np.sin(k * q[:, 0])
    error = (snapshot.positions - exact + box / 2) % box - box / 2
    assert np.abs(error).max() < tolerance * amplitude / k
    momentum = nbody.Background(PLANCK[0]).momentum_growth(1.0)[0] * (exact - q)
    assert np.abs(snapshot.momenta - momentum).max() < momentum_tolerance * np.abs(momentum).max()


def test_cola_conserves_mass_and_momentum():
    """Every particle counted once in each redshift's voxels; the total momentum zero (the initial field has no
    mean, and the PM forces sum to zero) to single-precision round-off of the force mesh."""
    settings = MockSection(dynamics="cola", particles_per_voxel_side=2, box_size_mpc_h=64.0, cola_steps=5)
    counts = mock.make_universe(PLANCK, 8, settings, np.random.default_rng(0))
    assert counts.dtype == np.int16
    assert counts.reshape(-1, 4).sum(axis=0).tolist() == [16 ** 3] * 4
    delta_k = mock.gaussian_random_field_k(16, 64.0, linear_power(), np.random.default_rng(0))
    for snapshot in nbody.evolve(delta_k, 16, 64.0, PLANCK[0], [3.0, 0.0], "cola", steps=5):
        assert np.abs(snapshot.momenta.sum(axis=0)).max() < 1e-5 * np.abs(snapshot.momenta).sum()
        assert ((snapshot.positions >= 0) & (snapshot.positions < 64.0)).all()


def test_every_dynamics_starts_from_the_same_field_and_zeldovich_is_unchanged():
    """One seed, one initial field: the three dynamics agree at high redshift where they all are linear theory,
    and differ at z = 0; the Zel'dovich counts are the ones this generator always made."""
    grid = 16
    results = {}
    for dynamics in ("zeldovich", "2lpt", "cola"):
        settings = MockSection(dynamics=dynamics, particles_per_voxel_side=1, box_size_mpc_h=128.0,
                               redshifts=[30.0, 0.0], cola_initial_redshift=40.0)
        results[dynamics] = mock.seeded_universe((0, 5, grid, 128.0, settings))
    for dynamics in ("2lpt", "cola"):
        np.testing.assert_array_equal(results[dynamics][1], results["zeldovich"][1])   # the same parameters
        early = results[dynamics][0][..., 0].astype(int) - results["zeldovich"][0][..., 0]
        late = results[dynamics][0][..., 1].astype(int) - results["zeldovich"][0][..., 1]
        assert np.abs(early).sum() < 0.01 * grid ** 3 < np.abs(late).sum()


def _power_ratios(n, box, redshifts, seeds, dynamics="cola", steps=10, n_bins=12, theory=False):
    """P(k) of the particles over D1^2 times the linear P(k): the initial field's own modes (cosmic variance
    divided out) or linear theory's; (k, ratios[seed, redshift, bin], modes per bin)."""
    p_lin = linear_power()
    background = nbody.Background(PLANCK[0])
    ratios = []
    for seed in seeds:
        delta_k = mock.gaussian_random_field_k(n, box, p_lin, np.random.default_rng(seed))
        k, p_field, modes = mock.measure_power_spectrum(np.fft.irfftn(delta_k, s=(n,) * 3, axes=(0, 1, 2)), box,
                                                       n_bins)
        reference = p_lin(k) if theory else p_field
        rows = []
        for snapshot in nbody.evolve(delta_k, n, box, PLANCK[0], redshifts, dynamics, steps=steps):
            _, p, _ = nbody.particle_power_spectrum(snapshot.positions, box, 2 * n, np.pi * n / box, n_bins)
            rows.append(p / reference / background.growth(snapshot.a)[0] ** 2)
        ratios.append(rows)
    return k, np.array(ratios), modes


def test_the_largest_scales_grow_as_linear_theory():
    """512 Mpc/h boxes, the three lowest k bins (k < 0.04 h/Mpc): P(k) / (D1^2 P_lin) at z = 3 and 0 within
    3 sigma of cosmic variance, sigma = sqrt(2 / modes) over the seeds' modes together.  Against the same
    modes of the initial field (the variance divided out): within 2% at z = 3 (measured under 1%); within 5% at
    z = 0, where measured 3.7%, 1.7% and 4.1% low (2LPT alone 1.4%, 1.0%, 3.0%): the nonlinear coupling is of
    that order at k = 0.036 h/Mpc (k^2 sigma_v^2 = 0.05, sigma_v = 5.8 Mpc/h the rms linear displacement per
    axis at z = 0), but only 0.008 at k = 0.016, where the rest is the default mesh's aliasing of the lattice
    (the pancake test's 12%; docs/cosmoflow.md, "How the dynamics were checked")."""
    seeds = (0, 1, 2)
    k, theory, modes = _power_ratios(32, 512.0, [3.0, 0.0], seeds, n_bins=16, theory=True)
    _, own, _ = _power_ratios(32, 512.0, [3.0, 0.0], seeds, n_bins=16)
    low = slice(0, 3)
    sigma = np.sqrt(2.0 / (modes[low] * len(seeds)))
    for z_index, tolerance in ((0, 0.02), (1, 0.05)):
        np.testing.assert_array_less(np.abs(theory[:, z_index, low].mean(axis=0) - 1), 3 * sigma)
        np.testing.assert_allclose(own[:, z_index, low].mean(axis=0), 1.0, atol=tolerance)


def test_the_power_spectrum_is_converged_in_the_number_of_steps():
    """10 steps against 20 from z = 9: P(k) at z = 0 within 2% up to half the particles' Nyquist wavenumber
    (0.39 h/Mpc here; about 0.5% measured)."""
    n, box = 32, 128.0
    k, ten, _ = _power_ratios(n, box, [0.0], (0,), steps=10)
    _, twenty, _ = _power_ratios(n, box, [0.0], (0,), steps=20)
    up_to = k <= 0.5 * np.pi * n / box
    np.testing.assert_allclose(ten[0, 0, up_to], twenty[0, 0, up_to], rtol=0.02)


def test_the_small_scale_boost_is_halofits_and_2lpt_lacks_it():
    """128 Mpc/h boxes of 32^3 particles, four seeds: at 0.15 <= k <= 0.5 h/Mpc the COLA power over linear
    theory is Takahashi et al.'s halofit boost within [0.88, 1.08] at z = 1 and z = 0 (halofit is quoted at 5%
    for k < 1 h/Mpc; ten PM steps on a mesh of two cells per particle lose some small-scale power; measured here
    0.92-1.05), where the boost itself reaches 1.5 (z = 1) and 2.2 (z = 0).  2LPT alone, from the same fields,
    falls below 0.6 of it at z = 0: the test tells dynamics that form halos from those that do not."""
    p_lin = linear_power()
    background = nbody.Background(PLANCK[0])
    redshifts = [1.0, 0.0]
    k, cola, _ = _power_ratios(32, 128.0, redshifts, range(4))
    _, lpt, _ = _power_ratios(32, 128.0, redshifts, range(4), dynamics="2lpt")
    band = (k >= 0.15) & (k <= 0.5)
    for z_index, z in enumerate(redshifts):
        a = 1 / (1 + z)
        growth = background.growth(a)[0] ** 2
        boost = halofit(k, lambda kk, g=growth: p_lin(kk) * g, float(background.omega_m_of_a(a))) / (p_lin(k) * growth)
        measured = cola[:, z_index].mean(axis=0) / boost
        assert ((measured[band] > 0.88) & (measured[band] < 1.08)).all(), (k[band], measured[band])
    assert boost[band].max() > 2.1
    assert (lpt[:, 1].mean(axis=0)[band][-1] / boost[band][-1]) < 0.6


@pytest.mark.parametrize("overrides, named", [
    (["data.mock.redshifts=[]"], "data.mock.redshifts"),
    (["data.mock.dynamics=cola", "data.mock.cola_mesh_factor=5"], "data.mock.cola_mesh_factor"),
    (["data.mock.dynamics=cola", "data.mock.cola_initial_redshift=2"], "data.mock.cola_initial_redshift"),
    (["data.mock.dynamics=2lpt", "data.mock.redshifts=[2000, 0]"], "data.mock.redshifts"),
    (["data.mock.omega_m_range=[0.001, 0.002]"], "data.mock.omega_m_range"),
])
def test_settings_the_dynamics_cannot_honour_are_one_line_naming_the_key(overrides, named):
    from common.config import load_config
    from common.errors import ConfigError
    from cosmoflow.config import CosmoflowConfig

    with pytest.raises(ConfigError) as refused:
        load_config(CosmoflowConfig, None, overrides, defaults={"data": {"data_dir": "/d"}})
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_a_voxel_beyond_int16_is_refused_not_clipped():
    """COLA gathers particles: 24^3 particles into a 2^3 grid of a 4 Mpc/h box packs more than 32767 into a
    voxel, which the files' int16 cannot hold."""
    from common.errors import ConfigError

    settings = MockSection(dynamics="cola", particles_per_voxel_side=24, box_size_mpc_h=4.0, cola_mesh_factor=1,
                           cola_steps=2)
    with pytest.raises(ConfigError, match="data.mock.particles_per_voxel_side"):
        mock.make_universe(PLANCK, 2, settings, np.random.default_rng(0))
