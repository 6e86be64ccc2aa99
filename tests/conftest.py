"""Shared fixtures: tiny datasets in real formats, and launching real Horovod ranks."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import common  # noqa: F401  (first: TensorFlow's kernel set and logging, for this process and every child)

REPO = pathlib.Path(__file__).resolve().parents[1]


def python_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_python(args, timeout=600, cwd=None, ranks: int = 1, check=True, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """Run ``python args...``; with ranks > 1 under ``horovodrun -np N --gloo``; ``env``: variables to add."""
    command = [sys.executable, *args]
    if ranks > 1:
        horovodrun = shutil.which("horovodrun") or str(pathlib.Path(sys.executable).parent / "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *command]
    result = subprocess.run(command, cwd=cwd or REPO, env=python_env(env), capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                             f"\n--- stderr\n{result.stderr[-6000:]}")
    return result


# Unit round-off u of each format (half the spacing of the numbers near 1).
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def summation_tolerance(n: int, scale: float, dtype: str = "float32") -> float:
    """How far two evaluations of the same sum of ``n`` terms may differ when the order differs.

    A sum of n terms in floating point is within gamma_n * sum|t_i| of the exact one, gamma_n = n u / (1 - n u)
    (Higham, Accuracy and Stability of Numerical Algorithms, 4.2), so two orders differ by at most twice that.
    The terms of the gradients and activations compared here have mixed signs; for such terms sum|t_i| is
    about sqrt(n) |sum t_i|, so with ``scale`` the magnitude of the results: 2 gamma_n sqrt(n) scale.
    Kernel sets (oneDNN, Eigen) and CPUs (AVX2, AVX-512) differ exactly in such orders and in FMA use.
    """
    u = UNIT_ROUNDOFF[dtype]
    gamma = n * u / (1 - n * u)
    return 2.0 * gamma * n ** 0.5 * scale


def kernel_tolerance(n: int, scale: float, compute_dtype: str) -> float:
    """``summation_tolerance`` for a kernel computing in ``compute_dtype`` with float32 accumulation
    (what oneDNN's and Eigen's CPU kernels do for bfloat16 and float16): the float32 sums may differ as
    above, and each path rounds its result to ``compute_dtype`` once, which can put the two a unit in the
    last place apart (2 u relative)."""
    tolerance = summation_tolerance(n, scale)
    if compute_dtype != "float32":
        tolerance += 2.0 * UNIT_ROUNDOFF[compute_dtype] * scale
    return tolerance


def last_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{text[-2000:]}")


@pytest.fixture(scope="session")
def tiny_cosmo_data(tmp_path_factory) -> pathlib.Path:
    """Mock universes, 16^3 x 4, 32 training + 16 validation samples, TFRecord."""
    from cosmoflow.config import MockSection
    from cosmoflow.mock import generate_dataset

    out = tmp_path_factory.mktemp("cosmo") / "data"
    mock = MockSection(box_size_mpc_h=128.0, seed=7)
    generate_dataset(out, 32, 16, 16, mock, progress=False)
    return out


def tiny_cosmo_overrides(data_dir, epochs=2, batch_size=4) -> list[str]:
    """--set overrides for a tiny CosmoFlow run on ``tiny_cosmo_data``."""
    pairs = {
        "data.data_dir": str(data_dir),
        "data.sample_shape": "[16, 16, 16, 4]",
        "data.batch_size": str(batch_size),
        "data.augment": "false",
        "data.mock.generate_if_missing": "false",
        "model.conv_blocks": "2",
        "model.base_filters": "4",
        "model.dense_units": "[16]",
        "model.dropout": "0.0",
        "train.precision": "fp32",  # the demo says auto; the tests want the same numbers on every CPU
        "train.epochs": str(epochs),
        "train.tensorboard": "false",
        "optimizer.name": "sgd",
        "optimizer.learning_rate": "0.01",
        "optimizer.schedule.warmup_epochs": "0",
        "optimizer.schedule.decay": "none",
    }
    out = []
    for key, value in pairs.items():
        out += ["--set", f"{key}={value}"]
    return out


def _free_port_pair() -> int:
    """A port p with p and p + 1 free on this machine (slurmctld and slurmd)."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 40000)
        try:
            for candidate in (port, port + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for the test SLURM cluster")


def live_processes() -> list[tuple[int, list[bytes]]]:
    """(pid, argv) of every live process (zombies, which PID 1 here reaps late, left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            with open(f"/proc/{entry}/status") as handle:
                zombie = "\nState:\tZ" in handle.read()
        except OSError:
            continue
        if argv and not zombie:
            found.append((int(entry), argv))
    return found


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node SLURM cluster (scripts/local_slurm.sh) for the whole test run: the environment its
    clients need.  Stopped at the end; no daemon or job process may be left behind."""
    if os.geteuid() != 0 and not shutil.which("slurmctld"):
        pytest.skip("the test SLURM cluster needs root (to install and run slurmctld as SlurmUser=root)")
    root = str(tmp_path_factory.mktemp("slurm"))
    env = {**os.environ, "LOCAL_SLURM_DIR": root, "LOCAL_SLURM_PORT": str(_free_port_pair()),
           "LOCAL_SLURM_CPUS": "4"}
    script = str(REPO / "scripts" / "local_slurm.sh")
    up = subprocess.run(["bash", script, "up"], env=env, capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        subprocess.run(["bash", script, "down"], env=env, capture_output=True, timeout=120)
        raise AssertionError(f"local_slurm.sh up failed:\n{up.stdout}\n{up.stderr}")
    conf = next(line.split("=", 1)[1] for line in up.stdout.splitlines() if line.startswith("SLURM_CONF="))
    # A process of another cluster's job, by its name: `down` stops this cluster's processes by pid and
    # by what they hold open in its folder, never by a pattern over the host's processes.
    # (It sleeps far longer than the cluster's tests take: killed below, it must not end by itself.)
    decoy = subprocess.Popen(["bash", "-c", 'exec -a "slurmstepd: [999.0]" sleep 86400'])
    try:
        # Open MPI refuses to run as root unless told; the jobs inherit this environment from sbatch.
        yield {"SLURM_CONF": conf, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    finally:
        ended_before = decoy.poll()
        subprocess.run(["bash", script, "down"], env=env, capture_output=True, timeout=120)
        decoy_survived = decoy.poll() is None
        decoy.kill()
        decoy.wait()
        assert ended_before is None, f"the decoy job step ended before local_slurm.sh down (exit {ended_before})"
        assert decoy_survived, "local_slurm.sh down killed a job step that was not its cluster's"
        left = [b" ".join(argv).decode(errors="replace") for pid, argv in live_processes()
                if pid != decoy.pid and (any(root.encode() in arg for arg in argv) or argv[0].startswith(b"slurmstepd"))]
        assert not left, "processes left behind by the test SLURM cluster:\n" + "\n".join(left)
