"""The suite never deletes or replaces a file it did not write, never generates into a folder that
holds anything, and names every bad file: each data-writing command and each demo config, on real
processes, against a folder holding one foreign file."""

import json
import pathlib

import h5py
import numpy as np
import pytest

from conftest import run_python, tiny_cosmo_overrides

FOREIGN = b"my own universe, not to be touched\n" * 50


def snapshot(root: pathlib.Path) -> dict:
    """Every path under ``root`` with its bytes (folders as None): what must not change."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def foreign(tmp_path) -> pathlib.Path:
    """``tmp_path/mydata`` holding one file of the user's, not in any layout the suite expects."""
    folder = tmp_path / "mydata"
    folder.mkdir()
    (folder / "my_universe_0001.tfrecord").write_bytes(FOREIGN)
    return folder


def refused(args, root, expect=None):
    """Run the command; it must exit 2 with a one-line error and leave ``root`` exactly as it was."""
    before = snapshot(root)
    result = run_python(args, check=False)
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    assert result.returncode == 2, result.stderr[-3000:]
    assert last.startswith("error: "), result.stderr[-3000:]
    if expect:
        assert expect in last, last
    assert snapshot(root) == before
    return last


GENERATORS = {
    "cosmoflow.mock": ["--n-train", "2", "--n-validation", "1", "--size", "8", "--workers", "1"],
    "climate_seg.cam5.synth": ["--grid", "8", "12", "--n-train", "1", "--n-validation", "1", "--n-test", "1"],
    "hep_cnn.synth": ["--n-train", "4", "--n-validation", "2", "--n-test", "2", "--image-size", "8"],
}


@pytest.mark.parametrize("module", sorted(GENERATORS))
def test_generators_refuse_a_folder_that_holds_anything(module, foreign):
    error = refused(["-m", module, "--out", str(foreign), *GENERATORS[module]], foreign.parent)
    assert str(foreign) in error and "my_universe_0001.tfrecord" in error and "expected" in error


@pytest.mark.parametrize("module", sorted(GENERATORS))
def test_generators_fill_an_empty_folder(module, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    run_python(["-m", module, "--out", str(empty), *GENERATORS[module]])
    assert any(p.is_file() for p in empty.rglob("*"))
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]   # no work folder left beside it


DEMOS = ["cosmoflow/demo.yaml", "hep_cnn/demo.yaml", "climate_seg/demo_tiramisu.yaml", "climate_seg/demo_deeplab.yaml",
         "climate_seg/demo_detect.yaml", "climate_seg/demo_detect_supervised.yaml"]


@pytest.mark.parametrize("config", DEMOS)
def test_demo_configs_refuse_to_generate_into_a_users_folder(config, foreign, tmp_path):
    app = config.split("/")[0]
    error = refused(["-m", f"{app}.train", "--config", f"configs/{config}", "--output-dir", str(tmp_path / "run"),
                     "--set", f"data.data_dir={foreign}", "--set", "train.epochs=1"], tmp_path)
    assert str(foreign) in error and "my_universe_0001.tfrecord" in error


def test_convert_refuses_an_output_folder_of_other_files(foreign, tmp_path):
    from climate_seg.cam5.config import SynthSection
    from climate_seg.cam5.synth import generate_dataset

    netcdf = generate_dataset(tmp_path / "nc", SynthSection(grid=(8, 12), n_train=2, n_validation=1, n_test=1),
                              progress=False)
    refused(["-m", "climate_seg.cam5.convert", "--input", str(netcdf["train"][0]), "--out", str(foreign)], tmp_path,
            "choose another --out")
    # Converting twice into the same folder replaces only the suite's own samples.
    out = tmp_path / "converted"
    for _ in range(2):
        run_python(["-m", "climate_seg.cam5.convert", "--input", str(netcdf["train"][0]), "--out", str(out)])
    assert len(list(out.glob("*.h5"))) == 2
    # A user's file of the same name as a sample is never replaced, even in a folder of the suite's samples.
    victim = sorted(out.glob("*.h5"))[0]
    with h5py.File(victim, "w") as f:
        f["mine"] = np.arange(3)
    refused(["-m", "climate_seg.cam5.convert", "--input", str(netcdf["train"][0]), "--out", str(out)], tmp_path)


def test_stats_never_replaces_a_shipped_statistics_file(tmp_path):
    from climate_seg.cam5.config import SynthSection
    from climate_seg.cam5.convert import convert
    from climate_seg.cam5.synth import generate_dataset

    netcdf = generate_dataset(tmp_path / "nc", SynthSection(grid=(8, 12), n_train=2, n_validation=1, n_test=1),
                              progress=False)
    data = tmp_path / "data"
    convert([str(netcdf["train"][0])], data / "train")
    with h5py.File(data / "stats.h5", "w") as f:   # the DeepCAM dataset's own file
        for key in ("minval", "maxval", "mean", "sqmean"):
            f[f"climate/{key}"] = np.arange(16.0)
    refused(["-m", "climate_seg.cam5.stats", str(data / "train")], tmp_path, "--out to write elsewhere")
    run_python(["-m", "climate_seg.cam5.stats", str(data / "train"), "--out", str(tmp_path / "mine.h5")])
    with h5py.File(tmp_path / "mine.h5") as f:
        assert f["mean"].shape == (16,)


def test_derived_files_are_the_suites_own_first_then_the_shipped_ones_never_written_into_the_data(tmp_path,
                                                                                                 monkeypatch):
    import hashlib
    import types

    from common.storage.derived import derived_dir, derived_file

    data = tmp_path / "published"
    data.mkdir()
    monkeypatch.setenv("HPCDL_DERIVED_DIR", str(tmp_path / "cache"))
    default = types.SimpleNamespace(data_dir=str(data), derived_dir=None)
    own = tmp_path / "cache" / f"published-{hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:12]}"
    assert derived_dir(default) == own
    assert derived_file(default, "stats.h5") == own / "stats.h5"            # nothing yet: where to write it
    (data / "stats.h5").write_bytes(b"shipped")
    assert derived_file(default, "stats.h5") == data / "stats.h5"           # shipped with the data: read there
    own.mkdir(parents=True)
    (own / "stats.h5").write_bytes(b"computed")
    assert derived_file(default, "stats.h5") == own / "stats.h5"            # the suite's own first
    chosen = types.SimpleNamespace(data_dir=str(data), derived_dir=str(tmp_path / "mine"))
    assert derived_file(chosen, "stats.h5") == data / "stats.h5"
    assert derived_dir(chosen) == tmp_path / "mine"


def test_maxima_go_to_the_derived_folder_never_over_a_users_file(tmp_path):
    from hep_cnn.synth import generate_dataset

    data = generate_dataset(tmp_path / "hep", 8, 4, 4, image_size=8, events_per_file=8, progress=False)
    users = '{"channel_max": [1, 2, 3], "weight_max": 1, "mine": true}\n'
    (data / "channel_maxima.json").write_text(users)
    before = sorted(p.name for p in data.iterdir())
    derived = tmp_path / "derived"
    args = ["-m", "hep_cnn.maxima", "--config", "configs/hep_cnn/demo.yaml", "--set", f"data.data_dir={data}",
            "--set", "data.image_size=8", "--set", f"data.derived_dir={derived}"]
    run_python(args)
    assert (data / "channel_maxima.json").read_text() == users and sorted(p.name for p in data.iterdir()) == before
    assert "mine" not in json.loads((derived / "channel_maxima.json").read_text())
    (derived / "channel_maxima.json").write_text(users)   # a file of the user's in the derived folder: kept
    refused(args, tmp_path, "--force")
    run_python([*args, "--force"])
    assert "mine" not in json.loads((derived / "channel_maxima.json").read_text())


def test_staging_refuses_a_folder_of_other_files(tiny_cosmo_data, tmp_path):
    stage = tmp_path / "stage"
    (stage / "rank-0").mkdir(parents=True)
    (stage / "rank-0" / "scratch.bin").write_bytes(FOREIGN)
    error = refused(["-m", "common.tools.slurm", "stage", "--config", "configs/cosmoflow/demo.yaml",
                     *tiny_cosmo_overrides(tiny_cosmo_data), "--set", f"data.stage_dir={stage}"], tmp_path)
    assert "did not stage" in error and "scratch.bin" in error


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_directory_of_another_tools_files_is_refused(tiny_cosmo_data, tmp_path, resume):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt-1.keras").write_bytes(FOREIGN)
    args = ["-m", "cosmoflow.train", "--config", "configs/cosmoflow/demo.yaml", "--output-dir", str(run),
            *tiny_cosmo_overrides(tiny_cosmo_data, epochs=1)] + (["--resume"] if resume else [])
    error = refused(args, tmp_path, "did not write")
    assert str(run) in error


def test_force_starts_a_run_afresh_and_writes_beside_other_files(tiny_cosmo_data, tmp_path):
    run = tmp_path / "run"
    args = ["-m", "cosmoflow.train", "--config", "configs/cosmoflow/demo.yaml", "--output-dir", str(run),
            *tiny_cosmo_overrides(tiny_cosmo_data, epochs=2)]
    run_python(args)
    (run / "notes.txt").write_bytes(FOREIGN)   # the user's, inside a run directory of the suite
    refused(args + ["--set", "train.epochs=1"], tmp_path, "--force")   # an earlier run's checkpoints
    run_python(args + ["--set", "train.epochs=1", "--force"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs_completed"] == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-epoch-00001.npz"]
    assert (run / "notes.txt").read_bytes() == FOREIGN
    # The MLPerf log is the new run's alone: one run_start, the one epoch it trained.
    log = (run / "mlperf.log").read_text()
    assert log.count('"key": "run_start"') == 1 and log.count('"key": "epoch_stop"') == 1, log[-2000:]


def test_a_yaml_file_the_suite_wrote_is_known_by_its_first_line(tmp_path):
    """System files (common.tools.sysbench) are YAML read by a strict schema: the suite's mark is a first-line
    comment, so a rerun may replace its own file and never a user's."""
    import yaml   # deferred: only this test reads YAML back

    from common.storage import outputs
    from common.storage.transaction import OutputTransaction, Producer

    def write(path, payload):
        transaction = OutputTransaction(Producer("common.tools.sysbench"))
        transaction.check([path])
        with transaction:
            transaction.yaml(path, payload)

    ours, theirs = tmp_path / "measured.yaml", tmp_path / "mine.yaml"
    write(ours, {"name": "virtual", "network": {"latency_s": 1e-3}})
    theirs.write_text("# my system\nname: mine\n")
    assert outputs.written_by_suite(ours) and not outputs.written_by_suite(theirs)
    assert yaml.safe_load(ours.read_text()) == {"name": "virtual", "network": {"latency_s": 1e-3}}
    write(ours, {"name": "again"})
    with pytest.raises(Exception, match="mine.yaml"):
        write(theirs, {"name": "x"})
    assert theirs.read_text() == "# my system\nname: mine\n"


# -- what kind of run a folder holds -----------------------------------------------------------------------------

def test_a_folder_knows_the_kind_of_run_it_holds(tmp_path):
    from common.errors import UserInputError
    from common.storage import run_dirs

    job, lone = tmp_path / "job", tmp_path / "lone"
    run_dirs.mark_run_dir(job, "cosmoflow", ["instances.json", "instance-0/", "instance-1/"], kind="instances",
                         instances=2)
    run_dirs.mark_run_dir(job / "instance-1", "cosmoflow", ["config.yaml"], kind="instance")
    run_dirs.mark_run_dir(lone, "cosmoflow", ["config.yaml"])
    assert run_dirs.run_kind(job)[0] == "instances" and run_dirs.run_kind(lone)[0] == "run"
    # An instance folder is one before its own run has marked it: the job's marker lists it.
    assert run_dirs.run_kind(job / "instance-0")[0] == "instance" and run_dirs.run_kind(job / "instance-1")[0] == "instance"
    run_dirs.check_run_kind(job, "instances", resume=True, instances=2)
    run_dirs.check_run_kind(lone, "run", resume=True)
    refusals = [
        (job, "run", True, None, "holds a job of 2 instances (distributed.instances); a training run would train beside "
                                 "its instance folders: resume the job with --set distributed.instances=2"),
        (job, "run", False, None, "choose another --output-dir"),
        (job, "instances", True, 3, "--resume with distributed.instances=3 cannot continue every one of them: set "
                                    "distributed.instances=2"),
        (job, "instances", False, 1, "a new job with distributed.instances=1 cannot continue every one of them"),
        (job / "instance-0", "run", True, None, f"is one instance of the job of 2 instances in {job}"),
        (lone, "instances", False, 2, "holds a training run (its own checkpoints and records); a job of several "
                                      "instances (distributed.instances) would train beside it"),
    ]
    for folder, kind, resume, count, expected in refusals:
        with pytest.raises(UserInputError, match=None) as caught:
            run_dirs.check_run_kind(folder, kind, resume, count)
        assert expected in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_job_marker_from_before_kinds_were_recorded_is_still_a_job(tmp_path):
    from common.storage import outputs, run_dirs

    job = tmp_path / "job"
    job.mkdir()
    (job / outputs.RUN_MARKER).write_text(json.dumps({
        outputs.WRITTEN_BY: outputs.provenance("cosmoflow.train"),
        "files": [".hpc-dl-suite-run.lock", "instance-0/", "instance-1/", "instance-2/", "instances.json"]}))
    kind, record = run_dirs.run_kind(job)
    assert kind == "instances" and run_dirs.recorded_instances(record) == 3


# -- nothing left in /tmp ------------------------------------------------------------------------------------------

def test_a_process_leaves_nothing_in_the_temporary_folder_even_when_killed(tmp_path):
    """Each process's temporary files go to a folder of its own, removed at its end: by ``exit_process`` (which
    skips the atexit handlers TensorFlow's AutoGraph counts on), at a normal exit, and, for a process killed
    outright, by the next process of the suite.  A folder of that name that is not the suite's is left alone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    users = tmp / "hpc-dl-suite-scratch-1-mine"   # the user's, though named like ours: it holds no lock file
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    write_one = ("import common, os, signal, sys, tempfile; from common.cli import exit_process; "
                 "open(os.path.join(tempfile.gettempdir(), '__autograph_generated_file1.py'), 'w').write('x'); "
                 "how = sys.argv[1]; "
                 "os.kill(os.getpid(), signal.SIGKILL) if how == 'kill' else exit_process(0) if how == 'exit' else None")
    for how in ("exit", "return"):
        run_python(["-c", write_one, how], env={"TMPDIR": str(tmp)})
        assert sorted(p.name for p in tmp.iterdir()) == [users.name], how
    killed = run_python(["-c", write_one, "kill"], env={"TMPDIR": str(tmp)}, check=False)
    assert killed.returncode == -9
    left = [p for p in tmp.iterdir() if p != users]
    assert len(left) == 1 and (left[0] / "__autograph_generated_file1.py").is_file()
    run_python(["-c", "import common"], env={"TMPDIR": str(tmp)})   # the next process of the suite sweeps it
    assert sorted(p.name for p in tmp.iterdir()) == [users.name] and (users / "notes.txt").read_text() == "mine"


# -- the temporary file of a killed write --------------------------------------------------------------------------

KILLED_MID_WRITE = """
import os, signal, sys, time
from common.storage.outputs import atomic_path
with atomic_path(sys.argv[1]) as temporary:
    open(temporary, "w").write('{"half')
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    print(temporary, flush=True)
    sys.stdin.readline()   # alive mid-write until told to go on
"""


def test_a_killed_writes_temporary_file_is_removed_by_the_next_holder_of_the_lock_and_nothing_else(tmp_path):
    """SIGKILL inside an atomic write leaves its hidden temporary file beside the real one (nothing runs in the
    process); the next command that takes the folder's lock (predict's --out, evaluate's or train's run folder)
    removes it.  Left alone: a live writer's (one that takes no lock, as cosmoflow.information --json into a
    run folder; it then finishes its write), one written on another host, a name the marker does not list, a
    folder, a link, the user's own file of a look-alike name."""
    import subprocess
    import sys

    from common.storage import outputs, run_dirs
    from conftest import REPO, python_env

    folder = tmp_path / "out"
    folder.mkdir()
    run_dirs.mark_run_dir(folder, "cosmoflow", files=["metrics.json", "curve.json"], kind="predictions", tool="test")
    outputs.write_json(folder / "metrics.json", {"whole": True}, "test")
    killed = run_python(["-c", KILLED_MID_WRITE, str(folder / "metrics.json"), "kill"], check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    (left,) = [path for path in folder.iterdir() if path.name.startswith(".metrics.json.")]
    assert left.read_text() == '{"half' and outputs.KILLED_WRITE.fullmatch(left.name)
    alive = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(folder / "curve.json"), "wait"], cwd=REPO,
                             env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    writing = pathlib.Path(alive.stdout.readline().strip())
    assert writing.parent == folder and writing.is_file()
    elsewhere = "0" * 8 if outputs.host_tag() != "0" * 8 else "1" * 8
    (folder / f".metrics.json.{elsewhere}_1_abcdefgh.partial").write_text("another host's")
    (folder / ".notes.txt.abcdefgh.partial").write_text("mine")              # not a name the marker lists
    (folder / ".metrics.json.20261206.partial").write_text("mine")           # the user's, of a look-alike name
    (folder / f".metrics.json.{outputs.host_tag()}_1_zzzzzzzz.partial").mkdir()   # a folder
    (folder / f".metrics.json.{outputs.host_tag()}_1_yyyyyyyy.partial").symlink_to(tmp_path)   # a link
    lock = run_dirs.RunDirLock(folder, "test").acquire()
    before = {path.name for path in folder.iterdir()}
    try:
        assert outputs.remove_killed_writes(folder) == [left]
    finally:
        lock.release()
    assert {path.name for path in folder.iterdir()} == before - {left.name}
    assert json.loads((folder / "metrics.json").read_text())["whole"] is True
    alive.communicate("go on\n", timeout=60)
    assert alive.returncode == 0 and (folder / "curve.json").read_text() == '{"half' and not writing.exists()
    assert outputs.remove_killed_writes(tmp_path) == []   # a folder without the suite's marker: nothing


# -- the work folder of a killed generation ------------------------------------------------------------------------

# One generation, as a process of its own: fill the work folder halfway, say where it is, then wait to be killed.
GENERATE = """
import sys, time
from common.storage.generated import generated_folder
with generated_folder(sys.argv[1], "test data") as work:
    (work / "half.txt").write_text("half")
    print(work, flush=True)
    time.sleep(120)
"""


def start_generation(target: pathlib.Path):
    """A generation of ``target`` in a process of its own, stopped inside its block: (process, work folder)."""
    import subprocess
    import sys

    from conftest import REPO, python_env

    process = subprocess.Popen([sys.executable, "-c", GENERATE, str(target)], cwd=REPO, env=python_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    work = pathlib.Path(process.stdout.readline().strip())
    assert work.parent == target.parent and (work / "half.txt").is_file(), process.stderr.read()
    return process, work


def generate(target: pathlib.Path) -> None:
    from common.storage.generated import generated_folder

    with generated_folder(target, "test data") as work:
        (work / "whole.txt").write_text("whole")


def test_a_killed_generations_work_folder_is_removed_by_the_next_one_and_a_running_ones_never(tmp_path):
    """SIGKILL mid-generation leaves its work folder (nothing can run in the process); the next generation of
    the same folder removes it (its lock is free) and leaves alone the work folder of a generation still running
    (its lock is held), a user's folder named like a work folder (no lock file) and another target's."""
    import signal

    target = tmp_path / "data"
    users = tmp_path / ".data.mine.partial"   # named as a work folder is, without the lock file: the user's
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    other, other_work = start_generation(tmp_path / "other")   # another target's, killed: not this one's to sweep
    other.kill()
    other.wait(timeout=60)
    running, running_work = start_generation(target)   # started first: the killed one's is left to the next
    killed, killed_work = start_generation(target)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL and killed_work.is_dir()
    try:
        generate(target)
        assert sorted(p.name for p in target.iterdir()) == ["whole.txt"]   # no lock file in the result
        assert not killed_work.exists()
        assert (running_work / "half.txt").is_file()   # a concurrent generation's folder: never swept
        assert (users / "notes.txt").read_text() == "mine" and (other_work / "half.txt").is_file()
    finally:
        running.kill()
        running.wait(timeout=60)
    generate(tmp_path / "third")   # another target: only its own work folders are its to sweep
    assert running_work.is_dir() and other_work.is_dir()
    generate(tmp_path / "other")
    assert not other_work.exists() and users.is_dir()


def test_sigterm_mid_generation_removes_the_work_folder(tmp_path):
    """``kill`` (SIGTERM, a batch system's cancel) ends a generation as Ctrl-C does: its work folder removed
    on the way out, exit 143, nothing under the target's name."""
    import signal

    target = tmp_path / "data"
    process, work = start_generation(target)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_locked_folder_is_refused_before_the_start_up_as_the_lock_refuses_it(tmp_path):
    """``refuse_if_locked`` (every train's check before TensorFlow loads) reads who holds a run folder's lock
    without taking it, and refuses with the words the lock itself would."""
    from common.errors import UserInputError
    from common.storage.outputs import RUN_LOCK
    from common.storage.run_dirs import RunDirLock, refuse_if_locked

    refuse_if_locked(tmp_path / "absent")   # no folder, no lock file: nothing to say
    refuse_if_locked(tmp_path)
    holder = RunDirLock(tmp_path, "cosmoflow.train").acquire()
    try:
        with pytest.raises(UserInputError) as early:
            refuse_if_locked(tmp_path)
        with pytest.raises(UserInputError) as taken:
            RunDirLock(tmp_path, "cosmoflow.train").acquire()
        assert str(early.value) == str(taken.value) and "in use by cosmoflow.train (pid " in str(early.value)
        assert str(taken.value).endswith("wait for it to end, or choose another --output-dir")
        # Each command's refusal names its own option, or none where the folder is the one it works on.
        for option, ending in (("--out", "wait for it to end, or choose another --out"),
                               (None, "wait for it to end")):
            with pytest.raises(UserInputError) as refused:
                RunDirLock(tmp_path, "cosmoflow.evaluate", option=option).acquire()
            assert str(refused.value).endswith(ending)
    finally:
        holder.release()
    refuse_if_locked(tmp_path)   # released: the file stays, the folder is free again
    assert (tmp_path / RUN_LOCK).is_file()


def test_a_lock_file_that_is_a_fifo_or_a_link_is_one_line(tmp_path):
    """What stands at the lock file's name is not opened through or written: a FIFO and a link are refused in a
    line each, the link's target untouched."""
    import os

    from common.errors import UserInputError
    from common.storage.outputs import RUN_LOCK
    from common.storage.run_dirs import RunDirLock

    fifo_run, link_run = tmp_path / "fifo", tmp_path / "link"
    fifo_run.mkdir()
    link_run.mkdir()
    os.mkfifo(fifo_run / RUN_LOCK)
    target = tmp_path / "precious.txt"
    target.write_text("mine\n")
    (link_run / RUN_LOCK).symlink_to(target)
    with pytest.raises(UserInputError, match="lock file is not a regular file"):
        RunDirLock(fifo_run, "cosmoflow.train").acquire()
    with pytest.raises(UserInputError, match=r"cannot open the run directory's lock file \(a link"):
        RunDirLock(link_run, "cosmoflow.train").acquire()
    assert target.read_text() == "mine\n"


def test_a_link_to_nothing_or_a_loop_is_not_replaced_by_an_output(tmp_path):
    """A dangling link or a loop of links named as an output: refused in one line (a rename would put a file
    where the user's link was); with --force, replaced."""
    from common.errors import UserInputError
    from common.storage.outputs import atomic_path
    from common.storage.transaction import OutputTransaction, Producer

    dangling, loop = tmp_path / "dangling.json", tmp_path / "loop.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    loop.symlink_to(loop)
    for link in (dangling, loop):
        with pytest.raises(UserInputError, match="a link; not replaced"):
            OutputTransaction(Producer("common.tools.bench")).check([link], options={link: "--json"})
        with pytest.raises(UserInputError, match="a link to nothing"):
            with atomic_path(link) as temporary:
                temporary.write_text("{}")
        assert link.is_symlink()
    with atomic_path(dangling, force=True) as temporary:
        temporary.write_text("{}")
    assert not dangling.is_symlink() and dangling.read_text() == "{}"
