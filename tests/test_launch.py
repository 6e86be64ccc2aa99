"""``python -m common.tools.launch`` is horovodrun: same ranks, output and exit codes; only its build check is
answered from a record of the installed build instead of a TensorFlow import on every launch."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import REPO, launcher, python_env

# TensorFlow's start-up lines: a process that imports TensorFlow with TF_CPP_MIN_LOG_LEVEL=0 prints them.
TENSORFLOW_STARTUP = ("oneDNN custom operations", "cpu_feature_guard", "absl::InitializeLog")

# Rank 1 fails a second after both have printed (horovodrun stops the others when one fails: a rank still
# printing could lose its line).
RANK_3_FAILS = ("import os, sys, time; rank = os.environ['HOROVOD_RANK']; print('rank', rank, 'of', "
                "os.environ['HOROVOD_SIZE'], flush=True); rank == '1' and time.sleep(1); "
                "sys.exit(3 if rank == '1' else 0)")


def run(command, cache):
    # TF_CPP_MIN_LOG_LEVEL=0: any TensorFlow import in the launcher's process tree shows in the output
    env = python_env({"XDG_CACHE_HOME": str(cache), "TF_CPP_MIN_LOG_LEVEL": "0"})
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def horovodrun() -> str:
    script = pathlib.Path(sys.executable).parent / "horovodrun"
    return str(script) if script.exists() else "horovodrun"


@pytest.mark.horovod
def test_the_launcher_runs_horovodrun_and_records_its_build_check_once(tmp_path):
    cache = tmp_path / "cache"
    command = [sys.executable, "-c", RANK_3_FAILS]
    reference = run([horovodrun(), "-np", "2", "-H", "localhost:2", "--gloo", *command], cache)
    first = run([*launcher(2), *command], cache)
    # the same job ending: exit 1 (horovodrun's for any failed rank) naming rank 1's code, both ranks' lines
    for result in (reference, first):
        out = result.stdout + result.stderr
        assert result.returncode == 1 and "Exit code: 3" in out, out[-3000:]
        assert "[0]<stdout>:rank 0 of 2" in out and "[1]<stdout>:rank 1 of 2" in out, out[-3000:]
    # ... but the launcher says it in one line, where horovodrun prints its own traceback
    assert "Traceback" in reference.stderr and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert ("error: a rank failed and Horovod stopped the job: the first was rank 1, Exit code: 3 (its lines "
            "above say why)") in first.stderr.splitlines(), first.stderr[-3000:]
    # horovodrun's check imports TensorFlow in the launcher's child: its start-up lines come before the ranks'
    assert any(line in reference.stderr for line in TENSORFLOW_STARTUP), reference.stderr[-3000:]
    records = list((cache / "hpc-dl-suite" / "horovod-builds").iterdir())
    assert len(records) == 1 and records[0].suffix == ".json", records
    record = json.loads(records[0].read_text())
    assert record["gloo_built"] is True and isinstance(record["mpi_built"], bool), record

    # Read back: no TensorFlow anywhere but in the ranks (which import none here), the record left as it is.
    before = records[0].stat().st_mtime_ns
    again = run([*launcher(2), sys.executable, "-c", "import os; print('rank', os.environ['HOROVOD_RANK'])"], cache)
    out = again.stdout + again.stderr
    assert again.returncode == 0 and "[0]<stdout>:rank 0" in out and "[1]<stdout>:rank 1" in out, out[-3000:]
    assert not any(line in out for line in TENSORFLOW_STARTUP), out[-3000:]
    assert records[0].stat().st_mtime_ns == before

    # A record that is not one (cut short, edited) is found out again and replaced whole.
    records[0].write_text('{"gloo_built": tr')
    mended = run([*launcher(2), sys.executable, "-c", "print('ok')"], cache)
    assert mended.returncode == 0 and mended.stdout.count("<stdout>:ok") == 2, mended.stdout + mended.stderr
    assert json.loads(records[0].read_text()) == record
    assert [p.name for p in records[0].parent.iterdir()] == [records[0].name]   # no temporary file left

    # Only a "built" answer is taken from a record: one saying "not built" leaves horovodrun to check itself
    # (and its check, importing TensorFlow, finds Gloo built here).
    records[0].write_text('{"gloo_built": false, "mpi_built": false}\n')
    checked = run([*launcher(2), sys.executable, "-c", "print('ok')"], cache)
    assert checked.returncode == 0 and checked.stdout.count("<stdout>:ok") == 2, checked.stdout + checked.stderr
    assert any(line in checked.stderr for line in TENSORFLOW_STARTUP), checked.stderr[-3000:]


@pytest.mark.horovod
def test_without_a_writable_cache_the_launcher_checks_as_horovodrun_does(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go\n")
    result = run([*launcher(2), sys.executable, "-c", "print('ok')"], blocked)
    assert result.returncode == 0 and result.stdout.count("<stdout>:ok") == 2, result.stdout + result.stderr
    assert blocked.read_text() == "a file where the cache folder would go\n"
    assert os.listdir(tmp_path) == ["not-a-folder"]
