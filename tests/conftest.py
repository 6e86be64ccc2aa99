"""Shared fixtures: tiny datasets in real formats, and launching real Horovod ranks."""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import common  # noqa: F401  (first: TensorFlow's kernel set and logging, for this process and every child)
from common.errors import UserInputError
from common.predict import predict_files, predictor_of
from common.storage import outputs, scratch

# The test process keeps its scratch folder too (TensorFlow's AutoGraph files of the in-process tests go with it,
# also when the run is killed: the next process of the suite sweeps it), while pytest's tmp_path stays under the
# usual temporary folder, where the processes the tests start can be given paths that outlive nothing.
SYSTEM_TEMP = pathlib.Path(tempfile.gettempdir()).parent if scratch.current() else pathlib.Path(tempfile.gettempdir())
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(SYSTEM_TEMP))


def pytest_sessionfinish(session, exitstatus):
    """The scratch folders of the processes the tests killed on purpose (SIGKILL leaves them to the next process
    of the suite): removed now, so a test run leaves nothing in the temporary folder.  With
    ``HPCDL_RECORD_DURATIONS=<file>``, what each test and fixture took is written there (``make durations``)."""
    scratch.sweep(SYSTEM_TEMP)
    record = os.environ.get("HPCDL_RECORD_DURATIONS")
    if record and _TIMES["tests"] and not hasattr(session.config, "workerinput"):   # one writer: not a worker
        known = read_durations(pathlib.Path(record), "HPCDL_RECORD_DURATIONS")
        for kind in ("tests", "fixtures"):   # a partial run keeps what it did not run
            known[kind] = dict(sorted({**known.get(kind, {}),
                                       **{k: round(v, 2) for k, v in _TIMES[kind].items()}}.items()))
        known.pop(outputs.WRITTEN_BY, None)
        outputs.write_json(record, known, DURATIONS_TOOL)   # whole or absent, and never through a link


DURATIONS_TOOL = "tests/conftest.py"
DURATIONS_MARK = outputs.provenance(DURATIONS_TOOL)


def read_durations(path: pathlib.Path, source: str) -> dict:
    """A durations record (``{}`` when ``path`` does not exist yet); a file that is not one is a one-line
    refusal naming it and ``source`` (the option or variable that named it): the suite replaces only its own."""
    if path.is_symlink():
        raise pytest.UsageError(f"{source}={path}: a link; name the file itself")
    if not path.exists():
        if not path.parent.is_dir():
            raise pytest.UsageError(f"{source}={path}: its folder does not exist")
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"{source}={path}: not a durations record of this suite "
                                f"({type(exc).__name__}); name a new file") from None
    if not isinstance(record, dict) or record.get("written_by") != DURATIONS_MARK:
        raise pytest.UsageError(f"{source}={path}: not a durations record of this suite (no written_by "
                                f"{DURATIONS_MARK!r}); name a new file, or remove it")
    return record


def pytest_configure(config):
    record = os.environ.get("HPCDL_RECORD_DURATIONS")
    if record:   # checked before the run, not after an hour of it
        read_durations(pathlib.Path(record), "HPCDL_RECORD_DURATIONS")


# `make test-fast` (pytest --fast): the edit-test loop without what takes long.  Left out: the SLURM clusters,
# the multi-node cluster and the tests marked as launching Horovod ranks, then every test that took more than
# FAST_LIMIT_S, or that needs a fixture that took more, in the last recorded run (tests/durations.json: `make
# durations` records it afresh).  A test the record does not know is kept.
FAST_LIMIT_S = 2.5
FAST_LEAVES_OUT_MARKERS = ("slurm", "multinode", "horovod", "slow")
DURATIONS = pathlib.Path(__file__).with_name("durations.json")
_TIMES: dict[str, dict[str, float]] = {"tests": {}, "fixtures": {}}


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help=f"leave out the clusters, the Horovod launches and whatever took over {FAST_LIMIT_S} s "
                          "in tests/durations.json (make test-fast)")


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):   # a pytest-xdist worker: its collection is what the scheduler shares out
        share_out(items)
    if not config.getoption("--fast"):
        return
    recorded = read_durations(DURATIONS, "--fast's record")
    if not recorded:
        print(f"--fast: no {DURATIONS.relative_to(REPO)} (make durations records it): only the clusters and "
              "the Horovod launches are left out", file=sys.stderr)
    tests, fixtures = recorded.get("tests", {}), recorded.get("fixtures", {})
    kept, left = [], []
    for item in items:
        slow = (any(item.get_closest_marker(m) for m in FAST_LEAVES_OUT_MARKERS)
                or tests.get(item.nodeid, 0.0) > FAST_LIMIT_S
                or any(fixtures.get(name, 0.0) > FAST_LIMIT_S for name in getattr(item, "fixturenames", ())))
        (left if slow else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


# `make test` runs the suite in `-n N` worker processes (pytest-xdist): a test's processes leave a core idle
# much of the time (TensorFlow's import and tracing run on one, SLURM and the clusters wait).  What a worker
# takes is one whole group (FilesAndClusters): a test file (its module and session fixtures are built once), or
# the two cluster files together (SLURM's daemons and job steps are watched for by name: two clusters up at
# once would see each other's).  The groups go out longest first, by the recorded durations.
CLUSTER_FILES = ("tests/test_multinode.py", "tests/test_slurm_cluster.py")
CLUSTER_MARKERS = ("slurm", "multinode")


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "clusters" if path in CLUSTER_FILES else path


def share_out(items) -> None:
    """A worker's collection: every cluster test in a cluster file, the groups longest first (the same order
    on every worker, each group in its own order)."""
    strays = [item.nodeid for item in items if any(item.get_closest_marker(m) for m in CLUSTER_MARKERS)
              and group_of(item.nodeid) != "clusters"]
    if strays:
        raise pytest.UsageError(f"{strays[0]}: a test on a SLURM cluster outside {', '.join(CLUSTER_FILES)} "
                                "(tests/conftest.py CLUSTER_FILES: the files whose tests one worker runs in turn)")
    recorded = read_durations(DURATIONS, "the recorded durations").get("tests", {})
    cost: dict[str, float] = {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        group = group_of(item.nodeid)
        cost[group] = cost.get(group, 0.0) + recorded.get(item.nodeid, 1.0)
        first_seen.setdefault(group, index)
    items.sort(key=lambda item: (-cost[group_of(item.nodeid)], first_seen[group_of(item.nodeid)]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    # deferred: pytest-xdist, only when it runs the suite (-n)
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndClusters(LoadScopeScheduling):
        """pytest-xdist's scope scheduling with the suite's groups (:func:`group_of`), in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False   # the workers' order (share_out's) is the one to keep
    return FilesAndClusters(config, log)


_FIXTURES_OF_THIS_SETUP: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    started = time.perf_counter()
    yield
    name, took = fixturedef.argname, time.perf_counter() - started
    _TIMES["fixtures"][name] = max(_TIMES["fixtures"].get(name, 0.0), took)
    _FIXTURES_OF_THIS_SETUP[name] = max(_FIXTURES_OF_THIS_SETUP.get(name, 0.0), took)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A setup's report carries the fixtures it built: under pytest-xdist only the reports reach the process
    that records them."""
    outcome = yield
    if call.when == "setup":
        outcome.get_result().user_properties.append(("fixture_seconds", dict(_FIXTURES_OF_THIS_SETUP)))
        _FIXTURES_OF_THIS_SETUP.clear()


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _TIMES["tests"][report.nodeid] = report.duration
    for name, took in dict(report.user_properties).get("fixture_seconds", {}).items():
        _TIMES["fixtures"][name] = max(_TIMES["fixtures"].get(name, 0.0), took)

REPO = pathlib.Path(__file__).resolve().parents[1]

# What the suite computes from a dataset (statistics, class counts, maxima) goes to the derived folder, by
# default in the user's cache: the tests' go to a folder of this session (children inherit it), removed after.
# Once per session: this file is imported as ``conftest`` and as ``tests.conftest``.
if "HPCDL_TEST_SESSION_DERIVED_DIR" not in os.environ:
    os.environ["HPCDL_TEST_SESSION_DERIVED_DIR"] = tempfile.mkdtemp(prefix="hpcdl-test-derived-")
    atexit.register(shutil.rmtree, os.environ["HPCDL_TEST_SESSION_DERIVED_DIR"], True)
DERIVED = pathlib.Path(os.environ["HPCDL_TEST_SESSION_DERIVED_DIR"])
os.environ["HPCDL_DERIVED_DIR"] = str(DERIVED)


def python_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launcher(ranks: int) -> list[str]:
    """``horovodrun -np N -H localhost:N --gloo`` as the suite launches it: horovodrun itself, without its build
    check's TensorFlow import on every launch (``common.tools.launch``; tests/test_launch.py holds it to
    horovodrun's behaviour)."""
    return [sys.executable, "-m", "common.tools.launch", "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"]


def run_python(args, timeout=600, cwd=None, ranks: int = 1, check=True, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """Run ``python args...``; with ranks > 1 under ``horovodrun -np N --gloo``; ``env``: variables to add."""
    command = [sys.executable, *args]
    if ranks > 1:
        command = [*launcher(ranks), *command]
    result = subprocess.run(command, cwd=cwd or REPO, env=python_env(env), capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                             f"\n--- stderr\n{result.stderr[-6000:]}")
    return result


def run_here(args, capsys) -> subprocess.CompletedProcess:
    """``python -m <module> args...`` (``args`` as :func:`run_python` takes them) run in this process as its
    ``__main__`` runs it (``common.cli.run_command`` with the declared command's main): for a command that must
    refuse before any work, where the process boundary is not what is tested, without a TensorFlow import of its
    own.  What it wrote to stdout and stderr comes back as :func:`run_python` returns it."""
    from common.cli import run_command
    from common.commands import declared, main_of

    assert args[0] == "-m", args
    module, argv = args[1], [str(a) for a in args[2:]]
    capsys.readouterr()
    code = run_command(main_of(declared(module)), argv, name=module)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([module, *argv], code, captured.out, captured.err)


def tree_state(*folders) -> dict:
    """Every path under ``folders`` (and the folders) with its size, mtime and bytes: what a refused command must
    leave as it was."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for folder in map(pathlib.Path, folders) if folder.exists() for p in sorted([folder, *folder.rglob("*")])}


def tree_contents(*folders) -> dict:
    """Every path under ``folders`` with what it is: a file's bytes, mode and mtime, a link's target, a folder's
    mode (not its mtime, which any entry made and removed again changes): what a command that failed or was
    interrupted after its claim must leave as it found it."""
    found = {}
    for folder in map(pathlib.Path, folders):
        if not (folder.exists() or folder.is_symlink()):
            continue
        for path in sorted([folder, *folder.rglob("*")]):
            status = path.lstat()
            if path.is_symlink():
                found[str(path)] = ("link", os.readlink(path))
            elif path.is_dir():
                found[str(path)] = ("folder", status.st_mode)
            else:
                found[str(path)] = ("file", status.st_mode, status.st_mtime_ns, path.read_bytes())
    return found


def tmp_root() -> pathlib.Path:
    """Where the tests' files are (pytest's temporary folders): a message naming one of them names a file."""
    return SYSTEM_TEMP


def assert_predict_refuses(package: str, cases, watched=()) -> None:
    """Each case ``(run, inputs, out, words)`` refused with one line holding every one of ``words`` (a string, or
    a list of them), and nothing changed under the run, ``out``, the inputs' folders and ``watched``.

    The first case runs the command (``python -m <package>.predict``: exit 2, one ``error:`` line on standard
    error); the others the same driver in this process (:func:`common.predict.predict_files` with the run's
    predictor: its one-line UserInputError is that line), so that each case does not pay a process's start-up."""
    for number, (run, inputs, out, words) in enumerate(cases):
        words = [words] if isinstance(words, str) else list(words)
        folders = [run, out, *{pathlib.Path(p).parent for p in inputs}, *watched]
        before = tree_state(*folders)
        if number == 0:
            result = run_python(["-m", f"{package}.predict", "--run-dir", str(run), "--input", *map(str, inputs),
                                 "--out", str(out)], check=False)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
            message = lines[0]
        else:
            with pytest.raises(UserInputError) as refused:
                predict_files(predictor_of(package, run), run, inputs, out)
            message = str(refused.value)
            assert "\n" not in message, message
        assert all(word in message for word in words), (words, message)
        assert str(tmp_root()) in message, ("the line names no file or folder", message)
        assert tree_state(*folders) == before, (words, message)


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


@pytest.fixture(autouse=True)
def _python_signal_handlers():
    """Every test starts with Python's own SIGINT and SIGTERM handling (Ctrl-C a KeyboardInterrupt), whatever an
    earlier test in this worker process left: a library that installs handlers and never puts them back (horovod's
    gloo runner does, for SIGINT and SIGTERM) would turn the signal tests' Ctrl-C into nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _renamed_keys_warn_afresh():
    """A renamed config key warns once a process (common.config): each test sees its own first warning."""
    from common import config

    config._WARNED_RENAMES.clear()


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


# --- SLURM jobs (tests/test_slurm_cluster.py, tests/test_multinode.py) ---------------------------------------

def submit(cluster, script, run_dir, *args, sbatch=(), env=None):
    """``sbatch <sbatch options> script args``; the job id (:func:`finished` waits for it: sbatch --wait polls
    only every few tens of seconds)."""
    variables = {**cluster, "RUN_DIR": str(run_dir), "PYTHON": sys.executable, "HPC_DL_ROOT": str(REPO),
                 **(env or {})}
    command = ["sbatch", "--parsable", f"--output={run_dir}.out", *sbatch, script, *args]
    result = subprocess.run(command, cwd=REPO, env={**os.environ, **variables}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return int(result.stdout.strip().splitlines()[0].split(";")[0])


def read(path) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def final_weights(run_dir):
    """The weights of ``run_dir/model.keras``."""
    import keras   # deferred: only the SLURM tests that compare trained models read one

    return keras.models.load_model(run_dir / "model.keras", compile=False).get_weights()


def job(cluster, job_id) -> dict:
    """``scontrol show job`` as a dict."""
    out = subprocess.run(["scontrol", "show", "job", str(job_id)], env={**os.environ, **cluster},
                         capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_for(condition, timeout, what, seen=(), about=None):
    """The first true value of condition(), polled every 0.5 s; past timeout, an error that names what
    was awaited and, if given, what was seen meanwhile (a list the condition fills) and what ``about()``
    says then (a job's state, the end of its log)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"; seen: {seen[-20:]}" if seen else "")
                         + (f"\n{about()}" if about is not None else ""))


# How long a tiny training may take to reach its first epochs (a checkpoint, a log line) before a test calls it
# stuck.  Alone it takes 10-40 s; beside the other pytest worker's multi-rank tests (every Horovod rank is a
# session of its own, and the kernel's autogroups share the CPU per session) a SLURM job took 178 s here to
# its second epoch and more than 180 s in CI, and a lone run more than 120 s to its first checkpoint: a bound
# for a run that does not start at all, not a speed target.
STARTUP_S = 600


def job_and_log(cluster, job_id, log) -> str:
    """A job's state and the end of its log: what a timed-out wait on a test cluster shows."""
    info = job(cluster, job_id)
    state = {key: info.get(key) for key in ("JobState", "Reason", "Restarts", "NodeList", "ExitCode", "RunTime")}
    return f"job {job_id}: {state}\n{log} ends with:\n{read(log)[-2000:]}"


def finished(cluster, job_id, timeout=600) -> dict:
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    return wait_for(lambda: (info := job(cluster, job_id)).get("JobState") in done and info, timeout,
                    f"job {job_id} to end")


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


def _free_subnet() -> str:
    """10.251.X (a /24) that this machine routes nowhere: the virtual cluster's own network."""
    import random

    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    for _ in range(200):
        subnet = f"10.251.{random.randint(1, 254)}"
        if f"{subnet}." not in routes:
            return subnet
    raise RuntimeError("no free 10.251.X.0/24 for the virtual cluster")


def cluster_leftovers(root: str, made: list[str], pids: list[int]) -> list[str]:
    """What a virtual cluster in ``root`` left behind: namespaces, links, control groups (the names it
    recorded), mounts of its folder, and its processes (the pids it recorded, and any naming its folder)."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left = []
    for line in made:
        kind, name = line.split(" ", 1)
        if (kind == "netns" and name in netns) or (kind in ("veth", "bridge") and f": {name}" in links) \
                or (kind == "cgroup" and os.path.exists(name)):
            left.append(f"{kind} {name}")
    with open("/proc/self/mountinfo") as handle:
        left += [f"mount {line.split()[4]}" for line in handle if root in line]
    alive = {pid for pid, _ in live_processes()}
    left += [f"process {pid}" for pid in pids if pid in alive]
    left += [f"process {pid}: {b' '.join(argv).decode(errors='replace')}" for pid, argv in live_processes()
             if any(root.encode() in arg for arg in argv)]
    return left


@pytest.fixture(scope="session")
def virtual_cluster(tmp_path_factory):
    """A 3-node virtual cluster (scripts/local_slurm.sh up --nodes 3: network namespaces on a bridge of
    their own, one slurmd each) for the whole test run: the environment its clients need, plus CLUSTER_DIR (its
    folder), CLUSTER_SUBNET and CLUSTER_SCRATCH (the node-local folder's path, the same on every node).  Torn down at the end;
    nothing it made may be left (asserted), and a process that merely looks like one of its daemons is
    not touched."""
    if os.geteuid() != 0:
        pytest.skip("the virtual cluster needs root (network namespaces, SlurmUser=root)")
    root = str(tmp_path_factory.mktemp("cluster"))
    env = {**os.environ, "LOCAL_SLURM_DIR": root, "LOCAL_SLURM_PORT": str(_free_port_pair()),
           "LOCAL_SLURM_SUBNET": _free_subnet(), "LOCAL_SLURM_CPUS": "2",
           # A silent node is DOWN after 40 s: well after the node-loss test's ranks give up (20 s without
           # progress), so that the job script, not SLURM's NODE_FAIL, is what finds the lost node there.
           "LOCAL_SLURM_SLURMD_TIMEOUT": "40"}
    script = str(REPO / "scripts" / "local_slurm.sh")
    up = subprocess.run(["bash", script, "up", "--nodes", "3"], env=env, capture_output=True, text=True,
                        timeout=600)
    if up.returncode != 0:
        subprocess.run(["bash", script, "down"], env=env, capture_output=True, timeout=300)
        raise AssertionError(f"local_slurm.sh up --nodes 3 failed:\n{up.stdout}\n{up.stderr}")
    values = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
    decoy = subprocess.Popen(["bash", "-c", 'exec -a "slurmd -N node1 -f /etc/slurm/slurm.conf" sleep 86400'])
    try:
        yield {"SLURM_CONF": values["SLURM_CONF"], "OMPI_ALLOW_RUN_AS_ROOT": "1",
               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "LOCAL_SLURM_DIR": root, "CLUSTER_DIR": root,
               "CLUSTER_SCRATCH": values["SCRATCH"], "CLUSTER_SUBNET": env["LOCAL_SLURM_SUBNET"]}
    finally:
        made = pathlib.Path(root, "run", "made").read_text().splitlines() if pathlib.Path(root, "run", "made").exists() \
            else []
        pids = [int(p.read_text()) for p in pathlib.Path(root, "run").glob("*.pid") if p.read_text().strip().isdigit()]
        down = subprocess.run(["bash", script, "down"], env=env, capture_output=True, text=True, timeout=300)
        again = subprocess.run(["bash", script, "down"], env=env, capture_output=True, text=True, timeout=300)
        decoy_survived = decoy.poll() is None
        decoy.kill()
        decoy.wait()
        assert down.returncode == 0 and again.returncode == 0, (down.stderr, again.stderr)
        assert decoy_survived, "local_slurm.sh down killed a process that was not its cluster's"
        assert made and any(line.startswith("bridge ") for line in made), made
        left = cluster_leftovers(root, made, pids)
        assert not left, "left behind by the virtual cluster:\n" + "\n".join(left)
