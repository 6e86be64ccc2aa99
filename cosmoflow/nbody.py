"""Gravitational dynamics for the mock universes: 2LPT initial conditions and COLA particle-mesh steps.

SC18's volumes were made with pycola: second-order Lagrangian perturbation theory (2LPT) for the initial
conditions, then a few particle-mesh (PM) steps in the COLA frame (Tassev, Zaldarriaga & Eisenstein 2013,
JCAP 06, 036), which form the halos and filaments whose information is not in P(k).  This module is the
suite's own small solver of the same kind (numpy and scipy; no MPI), used by :mod:`cosmoflow.mock` when
``data.mock.dynamics`` is ``2lpt`` or ``cola``.

Units and equations.  Comoving positions x in Mpc/h in a periodic box of side L; time is the scale factor a,
H0 = 1; flat LCDM, E(a) = H/H0 = sqrt(Omega_m a^-3 + 1 - Omega_m).  With the momentum p = a^3 E dx/da
(a^2 dx/dt), the equations of motion are

    dx/da = p / (a^3 E),    dp/da = 3/2 Omega_m f(x) / (a^2 E),    f = -grad phi,  lap phi = delta,

delta the density contrast.  Lagrangian perturbation theory writes x = q + D1 Psi1 + D2 Psi2 with
div Psi1 = -delta_L (the linear field at a = 1, D1(1) = 1) and Psi2 = grad phi2, lap phi2 =
sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2), lap phi1 = delta_L (Scoccimarro 1998; Crocce, Pueblas & Scoccimarro
2006, eq. 4-6, whose signs these are).  D1 and D2 solve their growth equations (in ln a, ' = d/dln a)

    D1'' + (2 - 3/2 Omega_m(a)) D1' = 3/2 Omega_m(a) D1,
    D2'' + (2 - 3/2 Omega_m(a)) D2' = 3/2 Omega_m(a) (D2 - D1^2),

from the matter era (D1 = a, D2 = -3/7 a^2), integrated here, not approximated.

COLA moves the particles in the frame of their 2LPT trajectories: x = x_LPT(a) + x_res, and integrates only
the residual, d/da (a^3 E dx_res/da) = 3/2 Omega_m / (a^2 E) [f_PM(x) - D1 Psi1 - (D2 - D1^2) Psi2], the
bracket being the PM force less the 2LPT trajectory's own acceleration (which the growth equations give).
The linear growth of large scales is exact whatever the number of steps; the steps (kick-drift-kick leapfrog,
the kick and drift factors integrated exactly over each step, the steps uniform in a, each output redshift a
step boundary) form the small-scale structure.  The PM force: cloud-in-cell (CIC) assignment of the particles
to a mesh ``mesh_factor`` times finer than their lattice, an FFT Poisson solve (Green's function -1/k^2), the
gradient by ik (zero on the Nyquist planes, so the forces sum to zero: momentum is conserved) and CIC
interpolation back to the particles; the mesh is placed so that the unperturbed particles sit between mesh
points (where CIC is smooth), and it is single precision.

One departure from Tassev et al.: the first-order part of the 2LPT acceleration, D1 Psi1, is subtracted as the
particle mesh itself computes it (its response to the lattice displaced by Psi1, :func:`linear_response`)
instead of analytically.  On a lattice the PM's linear response differs from the continuum's (a mesh twice
as fine as the lattice answers a plane wave of the box's size with 1.06 times its force: the lattice's own
period aliases onto it), and the standard subtraction integrates that discreteness error into the residual;
subtracting the PM's own response makes the dynamics exact at linear order (a plane wave of amplitude 0.01
follows Zel'dovich within 1%, against 6% otherwise) and brings the power at z = 1 from 1.07-1.14 of Takahashi
et al.'s halofit at 0.19-0.75 h/Mpc to 0.99-1.05 (tests/test_nbody.py; docs/cosmoflow.md gives the figures).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np
from scipy import fft
from scipy.integrate import quad, solve_ivp

from cosmoflow.summaries import spherical_average, wavenumbers

A_MATTER_ERA = 1e-8  # where the growth equations start, from their matter-era solutions (exact there for matter
# and Lambda alone; radiation is left out, as the mocks' 2LPT and COLA need no z > 1e3)


# -- the background and the growth of structure ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Background:
    """A flat matter + Lambda universe and its first- and second-order growth factors (D1(1) = 1)."""

    omega_m: float

    def e(self, a):
        """H(a) / H0."""
        return np.sqrt(self.omega_m * np.asarray(a, dtype=float) ** -3 + 1.0 - self.omega_m)

    def omega_m_of_a(self, a):
        a = np.asarray(a, dtype=float)
        return self.omega_m * a ** -3 / self.e(a) ** 2

    @functools.cached_property
    def _growth(self):
        def rhs(ln_a, y):
            d1, d1p, d2, d2p = y
            om = self.omega_m_of_a(np.exp(ln_a))
            friction = 2.0 - 1.5 * om
            return [d1p, -friction * d1p + 1.5 * om * d1, d2p, -friction * d2p + 1.5 * om * (d2 - d1 * d1)]

        a0 = A_MATTER_ERA
        solution = solve_ivp(rhs, (np.log(a0), 0.0), [a0, a0, -3.0 / 7.0 * a0 ** 2, -6.0 / 7.0 * a0 ** 2],
                             method="DOP853", rtol=1e-11, atol=1e-14, dense_output=True)
        d1_today = solution.sol(0.0)[0]
        return solution.sol, d1_today

    def growth(self, a) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(D1, dD1/dln a, D2, dD2/dln a) at ``a`` (between A_MATTER_ERA and 1), normalised so that D1(1) = 1 (D2
        by D1(1)^2)."""
        if np.any(np.asarray(a) < A_MATTER_ERA) or np.any(np.asarray(a) > 1.0):
            raise ValueError(f"growth factors are integrated for {A_MATTER_ERA:g} <= a <= 1, not a = {a}")
        sol, d1_today = self._growth
        d1, d1p, d2, d2p = sol(np.log(np.asarray(a, dtype=float)))
        return d1 / d1_today, d1p / d1_today, d2 / d1_today ** 2, d2p / d1_today ** 2

    def momentum_growth(self, a) -> tuple[float, float]:
        """(a^3 E dD1/da, a^3 E dD2/da): the momenta p of the 2LPT trajectory per unit Psi1 and Psi2."""
        _, d1p, _, d2p = self.growth(a)
        scale = a * a * self.e(a)
        return float(scale * d1p), float(scale * d2p)

    def kick_factor(self, a0: float, a1: float) -> float:
        """The integral of da / (a^2 E) from a0 to a1: dp = 3/2 Omega_m f times this."""
        return quad(lambda a: 1.0 / (a * a * self.e(a)), a0, a1, epsabs=0.0, epsrel=1e-12)[0]

    def drift_factor(self, a0: float, a1: float) -> float:
        """The integral of da / (a^3 E) from a0 to a1: dx = p times this."""
        return quad(lambda a: 1.0 / (a ** 3 * self.e(a)), a0, a1, epsabs=0.0, epsrel=1e-12)[0]


# -- Lagrangian perturbation theory ------------------------------------------------------------------------------

def lpt_displacements(delta_k: np.ndarray, n: int, box_size: float) -> tuple[np.ndarray, np.ndarray]:
    """(Psi1, Psi2), each (n^3, 3), on the lattice q of an n^3 grid, from the linear field's rfftn modes
    ``delta_k`` at a = 1 (numpy's rfftn convention, as :func:`cosmoflow.mock.gaussian_random_field_k` draws)."""
    k, components = wavenumbers(n, box_size)
    k2 = k ** 2
    k2[0, 0, 0] = 1.0
    phi1_k = -delta_k / k2
    shape = (n, n, n)

    def real(modes):
        return fft.irfftn(modes, s=shape)

    psi1 = np.empty((n ** 3, 3))
    for axis, ka in enumerate(components):
        # Psi1 = -grad phi1: -i k phi1_k
        psi1[:, axis] = real(-1j * ka * phi1_k).ravel()
    second = {}
    for i in range(3):
        for j in range(i, 3):
            second[i, j] = real(-components[i] * components[j] * phi1_k)
    source = (second[0, 0] * second[1, 1] + second[0, 0] * second[2, 2] + second[1, 1] * second[2, 2]
              - second[0, 1] ** 2 - second[0, 2] ** 2 - second[1, 2] ** 2)
    del second
    phi2_k = -fft.rfftn(source) / k2
    phi2_k[0, 0, 0] = 0.0
    psi2 = np.empty((n ** 3, 3))
    for axis, ka in enumerate(components):
        psi2[:, axis] = real(1j * ka * phi2_k).ravel()
    return psi1, psi2


def lattice(n: int, box_size: float) -> np.ndarray:
    """The particles' unperturbed positions q, (n^3, 3): one at the centre of each cell of an n^3 grid."""
    q = (np.arange(n) + 0.5) * (box_size / n)
    return np.stack(np.meshgrid(q, q, q, indexing="ij"), axis=-1).reshape(-1, 3)


# -- the particle mesh -------------------------------------------------------------------------------------------

class CloudInCell:
    """The 8 mesh cells each particle shares and their weights, computed once for a paint and a read-out."""

    def __init__(self, positions: np.ndarray, n_mesh: int, box_size: float, shift: float = 0.5):
        u = positions * (n_mesh / box_size) - shift  # mesh units
        base = np.floor(u)
        frac = u - base
        base = base.astype(np.int64) % n_mesh
        upper = (base + 1) % n_mesh
        self.n_mesh = n_mesh
        self.index = []
        self.weight = []
        for ox in (0, 1):
            ix, wx = (upper[:, 0], frac[:, 0]) if ox else (base[:, 0], 1.0 - frac[:, 0])
            for oy in (0, 1):
                iy, wy = (upper[:, 1], frac[:, 1]) if oy else (base[:, 1], 1.0 - frac[:, 1])
                for oz in (0, 1):
                    iz, wz = (upper[:, 2], frac[:, 2]) if oz else (base[:, 2], 1.0 - frac[:, 2])
                    self.index.append((ix * n_mesh + iy) * n_mesh + iz)
                    self.weight.append(wx * wy * wz)

    def paint(self) -> np.ndarray:
        """The number of particles per mesh cell, (n, n, n): mass conserved exactly."""
        total = np.zeros(self.n_mesh ** 3)
        for index, weight in zip(self.index, self.weight):
            total += np.bincount(index, weight, minlength=self.n_mesh ** 3)
        return total.reshape((self.n_mesh,) * 3)

    def read(self, fields: np.ndarray) -> np.ndarray:
        """``fields`` (n, n, n, c) at the particles, (particles, c), with the weights of :meth:`paint`."""
        flat = fields.reshape(-1, fields.shape[-1])
        out = np.zeros((len(self.index[0]), flat.shape[1]))
        for index, weight in zip(self.index, self.weight):
            out += flat[index] * weight[:, None]
        return out


@functools.lru_cache(maxsize=4)
def _force_kernels(n_mesh: int, box_size: float):
    """i k_a / k^2 for a = x, y, z on the mesh's rfftn grid: zero at k = 0 and on each axis' Nyquist plane (its
    derivative there is not a real field's; zeroing it keeps the PM forces summing to zero)."""
    k, components = wavenumbers(n_mesh, box_size)
    k2 = k ** 2
    k2[0, 0, 0] = 1.0
    nyquist = np.pi * n_mesh / box_size
    kernels = []
    for ka in components:
        kernel = np.where(np.isclose(np.abs(ka), nyquist), 0.0, 1j * ka / k2).astype(np.complex64)
        kernel[0, 0, 0] = 0.0
        kernels.append(kernel)
    return tuple(kernels)


def pm_force(positions: np.ndarray, n_mesh: int, box_size: float, mean_per_cell: float,
             shift: float = 0.5) -> np.ndarray:
    """f = -grad phi with lap phi = delta at the particles, (particles, 3), from an n_mesh^3 particle mesh.

    The mesh and its FFTs are single precision (a relative round-off of 1e-7 against the PM's own errors of
    percents); the particles' positions and momenta stay in double."""
    cic = CloudInCell(positions, n_mesh, box_size, shift)
    delta = (cic.paint() / mean_per_cell - 1.0).astype(np.float32)
    delta_k = fft.rfftn(delta)
    # f_k = -i k phi_k = i k delta_k / k^2
    forces = np.empty(delta.shape + (3,), dtype=np.float32)
    for axis, kernel in enumerate(_force_kernels(n_mesh, box_size)):
        forces[..., axis] = fft.irfftn(delta_k * kernel, s=delta.shape)
    return cic.read(forces)


def linear_response(psi: np.ndarray, q: np.ndarray, n_mesh: int, box_size: float, mean_per_cell: float,
                    shift: float = 0.5):
    """The PM force on the lattice ``q`` displaced by ``psi``, to first order in ``psi`` (a central difference
    over a displacement of a tenth of a mesh cell at most)."""
    epsilon = 0.1 * (box_size / n_mesh) / max(np.abs(psi).max(), 1e-30)
    plus = pm_force((q + epsilon * psi) % box_size, n_mesh, box_size, mean_per_cell, shift)
    minus = pm_force((q - epsilon * psi) % box_size, n_mesh, box_size, mean_per_cell, shift)
    return (plus - minus) / (2.0 * epsilon)


# -- evolution ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Snapshot:
    """Particles at one output scale factor: positions (particles, 3) in [0, L) and momenta p = a^3 E dx/da."""

    a: float
    positions: np.ndarray
    momenta: np.ndarray


def step_boundaries(a_initial: float, outputs: list[float], steps: int) -> np.ndarray:
    """``steps`` steps uniform in a from ``a_initial`` to the last output, every output a boundary (an output
    inside a step splits it)."""
    uniform = np.linspace(a_initial, max(outputs), steps + 1)
    later = np.array([a for a in outputs if a > a_initial])
    # an output within round-off of a uniform boundary takes its place (no step of zero width)
    near = np.array([np.isclose(later, b, rtol=0.0, atol=1e-9).any() for b in uniform], dtype=bool)
    return np.unique(np.concatenate([uniform[~near], later]))


def evolve(delta_k: np.ndarray, n: int, box_size: float, omega_m: float, redshifts, dynamics: str = "cola",
           steps: int = 10, initial_redshift: float = 9.0, mesh_factor: int = 2, timings: dict | None = None,
           lpt_frame: bool = True):
    """The particles of an n^3 lattice at each of ``redshifts`` (in the order given), under ``dynamics``:
    ``2lpt`` (the 2LPT trajectories alone) or ``cola`` (2LPT initial conditions at ``initial_redshift``, then
    ``steps`` COLA steps to the lowest redshift, on a PM mesh ``mesh_factor`` times finer than the lattice).
    Outputs at or before the initial redshift are the 2LPT particles there.  ``lpt_frame=False`` integrates the
    whole motion from the same initial conditions instead of the residual (a plain PM code: the tests' check of
    the kick and drift, whose growth then comes from the steps alone).  ``timings``, when given, receives the
    seconds spent: ``lpt`` (the displacements), ``linear_response``, ``steps`` (one entry a step)."""
    timings = {} if timings is None else timings
    clock = time.perf_counter()
    background = Background(omega_m)
    psi1, psi2 = lpt_displacements(delta_k, n, box_size)
    timings["lpt"] = time.perf_counter() - clock
    q = lattice(n, box_size)
    outputs = [1.0 / (1.0 + z) for z in redshifts]

    def lpt_motion(a):
        """The 2LPT trajectory's displacement and momentum at ``a``."""
        d1, _, d2, _ = background.growth(a)
        g1, g2 = background.momentum_growth(a)
        return d1 * psi1 + d2 * psi2, g1 * psi1 + g2 * psi2

    def lpt_snapshot(a):
        displacement, momentum = lpt_motion(a)
        return Snapshot(a, (q + displacement) % box_size, momentum)

    if dynamics == "2lpt":
        return [lpt_snapshot(a) for a in outputs]
    if dynamics != "cola":
        raise ValueError(f"dynamics {dynamics!r}: expected 2lpt or cola")

    a_initial = 1.0 / (1.0 + initial_redshift)
    n_mesh = n * mesh_factor
    mean_per_cell = n ** 3 / n_mesh ** 3
    prefactor = 1.5 * omega_m
    snapshots = {a: lpt_snapshot(a) for a in outputs if a <= a_initial}
    shift = 0.5 if mesh_factor % 2 == 0 else 0.0   # the lattice between mesh points: u = x N / L - shift
    timings["steps"] = []
    if lpt_frame:
        # the frame moves along the 2LPT trajectories; the residual starts at rest
        frame = lpt_motion
        x_res, p_res = np.zeros_like(q), np.zeros_like(q)
        clock = time.perf_counter()
        first_order = linear_response(psi1, q, n_mesh, box_size, mean_per_cell, shift)
        timings["linear_response"] = time.perf_counter() - clock
    else:
        frame = lambda a: (0.0, 0.0)   # noqa: E731 (the lattice, at rest)
        x_res, p_res = lpt_motion(a_initial)

    def residual_force(a):
        force = pm_force((q + frame(a)[0] + x_res) % box_size, n_mesh, box_size, mean_per_cell, shift)
        if lpt_frame:
            # less the 2LPT trajectory's own acceleration, its first order as the mesh computes it
            d1, _, d2, _ = background.growth(a)
            force -= d1 * first_order
            force -= (d2 - d1 * d1) * psi2
        return force

    boundaries = step_boundaries(a_initial, outputs, steps)
    force = residual_force(boundaries[0])
    for a0, a1 in zip(boundaries[:-1], boundaries[1:]):
        clock = time.perf_counter()
        a_half = 0.5 * (a0 + a1)
        p_res += prefactor * background.kick_factor(a0, a_half) * force
        x_res += background.drift_factor(a0, a1) * p_res
        force = residual_force(a1)
        p_res += prefactor * background.kick_factor(a_half, a1) * force
        for a in outputs:
            if np.isclose(a, a1, rtol=0.0, atol=1e-12) and a not in snapshots:
                x, p = frame(a)
                snapshots[a] = Snapshot(a, (q + x + x_res) % box_size, p + p_res)
        timings["steps"].append(time.perf_counter() - clock)
    return [snapshots[a] for a in outputs]


# -- measurement -------------------------------------------------------------------------------------------------

def particle_power_spectrum(positions: np.ndarray, box_size: float, n_mesh: int, k_max: float, n_bins: int = 16):
    """P(k) of particles: CIC on an n_mesh^3 mesh, the CIC window deconvolved, in ``n_bins`` linear bins from
    half the fundamental wavenumber to ``k_max`` (:func:`cosmoflow.mock.measure_power_spectrum`'s bins for
    ``k_max`` its grid's Nyquist wavenumber): (k centres, P, modes per bin).  The mesh should be finer than the
    particles' lattice (twice at least): the lattice's own peak, at its reciprocal vectors, aliases onto low k
    on a mesh of the lattice's size.  No shot noise is subtracted: particles that start on a lattice are far
    from Poisson (the unperturbed lattice has no power below its Nyquist wavenumber), and L^3/N would be wrong
    by a factor that changes as they cluster."""
    mesh = CloudInCell(positions, n_mesh, box_size).paint()
    delta = mesh / mesh.mean() - 1.0
    k, components = wavenumbers(n_mesh, box_size)
    window = np.ones_like(k)
    for ka in components:
        window = window * np.sinc(ka * box_size / n_mesh / (2.0 * np.pi)) ** 2
    power = np.abs(fft.rfftn(delta) / window) ** 2 * box_size ** 3 / n_mesh ** 6
    return spherical_average(k, power, n_mesh, box_size, n_bins, k_max)
