"""Staging (``data.stage_dir``, :func:`common.storage.staging.stage_files`): two jobs never share a rank's staged
copies at once, a copy is reused only while it holds the bytes staged, staging never writes into a data
folder or a user's folder, a full disk or a file size limit is one line naming the file, and the shipped
configs stage into a folder of each job's own."""

import json
import pathlib
import shutil
import struct
import subprocess
import sys

import google_crc32c
import pytest

from common.distributed import Distributed
from common.errors import ConfigError, DataError
from common.storage.staging import STAGE_LOCK, STAGE_MANIFEST, stage_files
from common.storage.tfrecord import masked_crc32c, scan_tfrecord
from conftest import REPO, python_env, run_python

# One job's staging, as a process of its own: stage a folder's TFRecords, say so, then keep reading the copies
# (hold them) until the test ends it.  A third argument sets a file size limit (Python ignores SIGXFSZ, so a
# write past it fails with EFBIG instead of killing the process).
JOB = """
import glob, resource, signal, sys
from common.cli import exit_on_user_error
from common.distributed import Distributed
from common.storage.staging import stage_files

data, stage, size_limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()   # the test starts the jobs' staging together
with exit_on_user_error():
    if size_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size_limit, size_limit))
    stage_files(sorted(glob.glob(data + "/*.tfrecord")), stage, Distributed(), data_dir=data)
print("staged", flush=True)
sys.stdin.readline()
"""


def write_dataset(folder: pathlib.Path, tag: bytes, names=("a", "b", "c"), record_bytes=40_000) -> dict:
    """TFRecord files (one record each, framed with their CRCs) whose payload is ``tag`` repeated: datasets
    with the same names and sizes and other bytes.  {name: bytes} of each file."""
    folder.mkdir(parents=True)
    written = {}
    for name in names:
        payload = (tag * record_bytes)[:record_bytes]
        length = struct.pack("<Q", len(payload))
        record = length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))
        (folder / f"{name}.tfrecord").write_bytes(record)
        written[f"{name}.tfrecord"] = record
    return written


def sources(folder: pathlib.Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.tfrecord"))


def copies(stage: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((stage / "rank-0").glob("*.tfrecord"))}


def snapshot(root: pathlib.Path) -> dict:
    """Every path under ``root`` with its bytes (folders as None): what a refusal must leave as it was."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def start_job(data, stage, size_limit=0) -> subprocess.Popen:
    job = subprocess.Popen([sys.executable, "-c", JOB, str(data), str(stage), str(size_limit)], cwd=REPO,
                           env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    assert job.stdout.readline().strip() == "ready", job.stderr.read()
    return job


# -- two jobs on one node -------------------------------------------------------------------------------------

def test_two_jobs_staging_into_one_folder_at_once_the_second_is_refused_and_the_first_keeps_its_copies(tmp_path):
    """Two real processes stage two datasets (same names and sizes, other bytes) into one stage_dir at the same
    moment: one stages and holds its copies, the other exits 2 naming it and replaces nothing; once the holder
    is gone (killed: the lock dies with it) the folder can be staged again."""
    datasets = {name: write_dataset(tmp_path / name, tag) for name, tag in (("first", b"FIRST"), ("second", b"2nd"))}
    stage = tmp_path / "stage"
    jobs = {name: start_job(tmp_path / name, stage) for name in datasets}
    for job in jobs.values():   # both imported: start the staging of both together
        job.stdin.write("go\n")
        job.stdin.flush()
    outcome = {}
    for name, job in jobs.items():
        line = job.stdout.readline().strip()
        outcome[name] = "staged" if line == "staged" else (job.wait(timeout=120), job.stderr.read().strip())
    staged = [name for name, result in outcome.items() if result == "staged"]
    assert len(staged) == 1, outcome
    holder = staged[0]
    (refused,) = set(jobs) - {holder}
    status, stderr = outcome[refused]
    message = stderr.splitlines()[-1]
    assert status == 2 and len(stderr.splitlines()) == 1, stderr
    assert message.startswith(f"error: {stage / 'rank-0'}: staged copies in use by ")
    assert f"pid {jobs[holder].pid} " in message and "wait for it to end, or give each job" in message
    # The holder still reads its own dataset: nothing of the other was written over it.
    assert copies(stage) == datasets[holder]
    jobs[holder].kill()
    jobs[holder].wait(timeout=60)
    again = stage_files(sources(tmp_path / refused), str(stage), Distributed(), data_dir=str(tmp_path / refused))
    assert {pathlib.Path(p).name: pathlib.Path(p).read_bytes() for p in again} == datasets[refused]


def test_fewer_files_than_ranks_is_one_line_on_every_rank_before_anything_is_staged(tmp_path):
    """Staging deals whole files to ranks: with fewer files than ranks one rank would stage none (its reader then
    failed with a TypeError traceback while the others trained on).  Every rank gets the same one-line refusal."""
    write_dataset(tmp_path / "data", b"one", names=("a",))
    files = sources(tmp_path / "data")
    stage = tmp_path / "stage"
    for rank in (0, 1):
        dist = Distributed()
        dist.rank, dist.size = rank, 2
        with pytest.raises(DataError, match=r"1 training file\(s\) for 2 ranks: staging gives each rank whole files"):
            stage_files(files, str(stage), dist, data_dir=str(tmp_path / "data"))
    assert not stage.exists()


# -- copies identified by their content ------------------------------------------------------------------------

def test_copies_of_another_dataset_put_in_place_are_staged_again(tmp_path):
    """The copies of another dataset (same names and sizes, timestamps kept) put under the manifest of this
    one: not reused; a copy whose bytes no longer match the recorded CRC-32C neither."""
    ours = write_dataset(tmp_path / "ours", b"ours")
    other = write_dataset(tmp_path / "other", b"OTHER")
    stage, elsewhere = tmp_path / "stage", tmp_path / "elsewhere"
    stage_files(sources(tmp_path / "ours"), str(stage), Distributed(), data_dir=str(tmp_path / "ours"))
    stage_files(sources(tmp_path / "other"), str(elsewhere), Distributed(), data_dir=str(tmp_path / "other"))
    for name in other:   # another job's copies, timestamps and all, over ours
        shutil.copy2(elsewhere / "rank-0" / name, stage / "rank-0" / name)
    again = stage_files(sources(tmp_path / "ours"), str(stage), Distributed(), data_dir=str(tmp_path / "ours"))
    assert {pathlib.Path(p).name: pathlib.Path(p).read_bytes() for p in again} == ours
    # A copy whose identity is as recorded but whose bytes are not those staged (the manifest's CRC-32C of
    # them changed, as a bit flipped in the copy would): staged again; the others are reused untouched.
    manifest_path = stage / "rank-0" / STAGE_MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["b.tfrecord"]["crc32c"] ^= 1
    manifest_path.write_text(json.dumps(manifest))
    inodes = {p.name: p.stat().st_ino for p in (stage / "rank-0").glob("*.tfrecord")}
    stage_files(sources(tmp_path / "ours"), str(stage), Distributed(), data_dir=str(tmp_path / "ours"))
    after = {p.name: p.stat().st_ino for p in (stage / "rank-0").glob("*.tfrecord")}
    assert after["a.tfrecord"] == inodes["a.tfrecord"] and after["c.tfrecord"] == inodes["c.tfrecord"]
    assert after["b.tfrecord"] != inodes["b.tfrecord"] and copies(stage) == ours
    recorded = json.loads(manifest_path.read_text())["files"]
    assert all(recorded[name]["crc32c"] == google_crc32c.value(ours[name]) for name in ours)
    assert all(scan_tfrecord(str(stage / "rank-0" / name)) == 1 for name in ours)


# -- never into a data folder or a user's folder ---------------------------------------------------------------

@pytest.mark.parametrize("where", ["the data folder", "inside it", "a link to it", "a link into it", "holding it"])
def test_a_stage_dir_that_is_in_or_holds_the_data_folder_is_refused(tmp_path, where):
    data = tmp_path / "data"
    write_dataset(data / "train", b"data")
    (tmp_path / "link").symlink_to(data)
    stage = {"the data folder": data, "inside it": data / "staged", "a link to it": tmp_path / "link",
             "a link into it": tmp_path / "link" / "train" / "staged", "holding it": tmp_path}[where]
    before = snapshot(tmp_path)
    with pytest.raises(DataError, match=rf"^{stage}: data.stage_dir (is|lies inside|holds) the data folder "
                                        rf"{data.resolve()}\b.*choose a folder outside it"):
        stage_files(sources(data / "train"), str(stage), Distributed(), data_dir=str(data))
    assert snapshot(tmp_path) == before


def test_a_stage_dir_that_is_a_users_folder_is_refused_and_left_as_it_was(tmp_path):
    write_dataset(tmp_path / "data", b"data")
    stage = tmp_path / "mine"
    stage.mkdir()
    (stage / "notes.txt").write_text("mine\n")
    before = snapshot(stage)
    with pytest.raises(DataError, match=rf"^{stage}: data.stage_dir holds files this suite did not stage "
                                        r"\(1: notes.txt\)"):
        stage_files(sources(tmp_path / "data"), str(stage), Distributed(), data_dir=str(tmp_path / "data"))
    # A rank folder holding a user's file: refused before the lock file is made in it.
    shutil.rmtree(stage)
    (stage / "rank-0").mkdir(parents=True)
    (stage / "rank-0" / "scratch.bin").write_bytes(b"mine")
    before = snapshot(stage)
    with pytest.raises(DataError, match=r"did not stage \(1: scratch.bin\)"):
        stage_files(sources(tmp_path / "data"), str(stage), Distributed(), data_dir=str(tmp_path / "data"))
    assert snapshot(stage) == before and not (stage / "rank-0" / STAGE_LOCK).exists()


def test_bench_stage_decompressed_into_a_users_folder_is_refused(tmp_path):
    """``bench --input-only --stage-decompressed DIR`` stages through the same mechanism: a user's folder is
    refused with one line, and holds afterwards what it held before."""
    from cosmoflow.config import MockSection
    from cosmoflow.mock import generate_dataset

    data = generate_dataset(tmp_path / "gz", 4, 4, 16, MockSection(box_size_mpc_h=128.0, seed=3),
                            compression="gzip", progress=False, workers=1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.csv").write_text("a,b\n1,2\n")
    before = snapshot(mine)
    result = run_python(["-m", "common.tools.bench", "--config", str(REPO / "configs/cosmoflow/demo.yaml"),
                         "--set", f"data.data_dir={data}", "--set", "data.sample_shape=[16,16,16,4]",
                         "--set", "data.compression=gzip", "--set", "data.batch_size=2",
                         "--set", "data.mock.generate_if_missing=false", "--steps", "1", "--input-only",
                         "--stage-decompressed", str(mine)], check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last == (f"error: {mine}: data.stage_dir holds files this suite did not "
                                               "stage (1: results.csv); choose an absent or empty folder, or one "
                                               "this suite staged into"), result.stderr[-3000:]
    assert snapshot(mine) == before


# -- a full disk or a file size limit ---------------------------------------------------------------------------

def test_a_file_size_limit_while_staging_is_one_line_naming_the_file_and_the_partial_copy_is_removed(tmp_path):
    """A real RLIMIT_FSIZE below the files' size (EFBIG, as a full disk gives ENOSPC): exit 2 with one line
    naming the file and the stage folder; no partial copy left; staged whole on the next try."""
    data = write_dataset(tmp_path / "data", b"big", record_bytes=300_000)
    stage = tmp_path / "stage"
    job = start_job(tmp_path / "data", stage, size_limit=100_000)
    stdout, stderr = job.communicate("go\n", timeout=120)
    lines = stderr.strip().splitlines()
    assert job.returncode == 2 and len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "could not be staged to" in lines[0] and "File too large" in lines[0]
    named = lines[0].removeprefix("error: ").split(":")[0]
    assert named in sources(tmp_path / "data") and f"to {stage / 'rank-0'} (" in lines[0]
    assert "the partial copy was removed" in lines[0]
    assert sorted(p.name for p in (stage / "rank-0").iterdir()) == sorted([STAGE_LOCK, STAGE_MANIFEST])
    again = stage_files(sources(tmp_path / "data"), str(stage), Distributed(), data_dir=str(tmp_path / "data"))
    assert {pathlib.Path(p).name: pathlib.Path(p).read_bytes() for p in again} == data


# -- a folder of each job's own ----------------------------------------------------------------------------------

def test_stage_dir_expands_environment_variables_and_an_unset_one_is_one_line(tmp_path, monkeypatch):
    write_dataset(tmp_path / "data", b"data")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    staged = stage_files(sources(tmp_path / "data"), str(tmp_path / "stage-${SLURM_JOB_ID}"), Distributed(),
                         data_dir=str(tmp_path / "data"))
    assert all(p.startswith(f"{tmp_path}/stage-4242/rank-0/") for p in staged)
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(ConfigError, match=r"^data.stage_dir: .*/stage-\$SLURM_JOB_ID names the environment "
                                          r"variable \$SLURM_JOB_ID, which is not set here"):
        stage_files(sources(tmp_path / "data"), str(tmp_path / "stage-$SLURM_JOB_ID"), Distributed())


def test_slurm_env_prints_the_stage_dir_the_job_stages_into():
    """What slurm/launch.sh reads before it stages: a folder per job where the config asks for one (the shipped
    configs share a fixed folder per node, safely: the second job on a node is refused); unset, one line."""
    config = REPO / "configs/cosmoflow/gpu4.yaml"
    per_job = ["--set", "data.stage_dir=/dev/shm/cosmoflow-${SLURM_JOB_ID}"]
    env = {key: value for key, value in python_env({"SLURM_JOB_ID": "777"}).items()}
    command = [sys.executable, "-m", "common.tools.slurm", "env", "--config", str(config), *per_job]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "STAGE_DIR=/dev/shm/cosmoflow-777" in result.stdout.splitlines()
    env.pop("SLURM_JOB_ID")
    command = [sys.executable, "-m", "common.tools.slurm", "env", "--config", str(config), *per_job]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: data.stage_dir: /dev/shm/cosmoflow-${SLURM_JOB_ID} names the environment variable $SLURM_JOB_ID, "
        "which is not set here; set it, or set data.stage_dir to a path without it (--set data.stage_dir=...)")


# -- a staging killed while writing ----------------------------------------------------------------------------

# A staging whose writes stop halfway: each copy's temporary file holds some bytes, then the process waits to be
# killed (the format's writer is where a real copy spends its time).
KILLED_MID_COPY = """
import glob, os, pathlib, sys, time
from common.distributed import Distributed
from common.storage.staging import StagedFormat, stage_files

def write(source, destination):
    pathlib.Path(destination).write_bytes(b"half a copy")
    os.write(1, b"writing\\n")   # one write: the copies run in threads, and print's two writes interleave
    time.sleep(120)

data, stage = sys.argv[1], sys.argv[2]
stage_files(sorted(glob.glob(data + "/*.tfrecord")), stage, Distributed(), data_dir=data,
            staged_format=StagedFormat("slow", "", write))
"""


def test_the_partial_copies_of_a_killed_staging_are_removed_by_the_next_one(tmp_path, caplog):
    """SIGKILL while copying leaves the copies' temporary files (``.<name>.<random>.partial``) in the rank
    folder; the next staging there, holding the folder's lock, removes them and stages every file whole.  A
    file of another name is left alone."""
    ours = write_dataset(tmp_path / "data", b"data")
    stage = tmp_path / "stage"
    killed = subprocess.Popen([sys.executable, "-c", KILLED_MID_COPY, str(tmp_path / "data"), str(stage)], cwd=REPO,
                              env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "writing", killed.stderr.read()
    killed.kill()
    killed.wait(timeout=60)
    partial = sorted(p.name for p in (stage / "rank-0").glob(".*.partial"))
    assert partial and all(name.split(".")[1] in ("a", "b", "c") for name in partial), partial
    other = stage / "rank-0" / ".notes.txt.x1.partial"   # no name this staging lists or writes
    other.write_text("not a copy of ours")
    with caplog.at_level("WARNING", logger="common.storage.staging"):
        again = stage_files(sources(tmp_path / "data"), str(stage), Distributed(), data_dir=str(tmp_path / "data"))
    assert {pathlib.Path(p).name: pathlib.Path(p).read_bytes() for p in again} == ours
    assert sorted(p.name for p in (stage / "rank-0").glob(".*.partial")) == [other.name]
    assert f"removed {len(partial)} partial cop" in caplog.text
