"""`make test-fast` and `make durations`: what the recorded durations choose, and that recording them replaces
no file but its own."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import DURATIONS_MARK, REPO, python_env

QUICK = "tests/test_lint.py::test_the_lint_finds_an_undefined_name_and_an_unused_import"
ALSO = "tests/test_lint.py::test_ruff_finds_nothing"


def pytest_run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO,
                          env=python_env(env), capture_output=True, text=True, timeout=300)


def test_recording_durations_writes_its_own_file_and_refuses_anyone_elses(tmp_path):
    record = tmp_path / "durations.json"
    assert pytest_run(QUICK, env={"HPCDL_RECORD_DURATIONS": str(record)}).returncode == 0
    written = json.loads(record.read_text())
    assert written["written_by"] == DURATIONS_MARK and set(written["tests"]) == {QUICK}, written
    # A second run adds to it (a partial run keeps what it did not run).
    assert pytest_run(ALSO, env={"HPCDL_RECORD_DURATIONS": str(record)}).returncode == 0
    assert set(json.loads(record.read_text())["tests"]) == {QUICK, ALSO}
    assert [p.name for p in tmp_path.iterdir()] == ["durations.json"]   # no temporary file left

    users = tmp_path / "package.json"
    users.write_text('{"name": "not ours"}\n')
    (tmp_path / "folder").mkdir()
    for target in (users, tmp_path / "folder", tmp_path / "missing" / "d.json"):
        refused = pytest_run(QUICK, env={"HPCDL_RECORD_DURATIONS": str(target)})
        # refused before any test runs (pytest's usage error, exit 4), naming the variable and the file
        assert refused.returncode == 4 and f"HPCDL_RECORD_DURATIONS={target}" in refused.stderr, refused.stderr
        assert "passed" not in refused.stdout
    assert users.read_text() == '{"name": "not ours"}\n'


def test_fast_leaves_out_what_the_record_says_took_long():
    recorded = json.loads((REPO / "tests" / "durations.json").read_text())
    slow = [test for test, seconds in recorded["tests"].items() if seconds > 2.5 and "test_lint.py" not in test]
    assert slow, "the record holds no slow test"
    result = pytest_run("--fast", "--collect-only")
    collected = set(result.stdout.split())
    assert result.returncode == 0 and QUICK in collected, result.stdout[-2000:] + result.stderr
    assert not collected & set(slow), sorted(collected & set(slow))[:5]
    assert not any("test_slurm_cluster.py" in line or "test_multinode.py" in line for line in collected)


def test_make_tests_workers_take_whole_files_and_the_clusters_together():
    """`make test` (pytest -n N): a file is one worker's, whole (its fixtures are built once); the two cluster
    files are one group (tests/conftest.py: FilesAndClusters)."""
    from conftest import CLUSTER_FILES, group_of

    assert {group_of(f"{path}::test_x") for path in CLUSTER_FILES} == {"clusters"}
    assert group_of("tests/test_config.py::test_x[a::b]") == "tests/test_config.py"
    files = ("tests/test_config.py", "tests/test_slurm.py", "tests/test_selection.py")
    result = pytest_run("-n", "2", "-vv", "-k", "not test_make_tests_workers and not test_recording_durations",
                        *files)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    workers: dict[str, set] = {}
    for line in result.stdout.splitlines():
        if "PASSED" in line and line.startswith("[gw"):
            worker, path = line.split("]", 1)[0][1:], line.split("PASSED", 1)[1].split("::", 1)[0].strip()
            workers.setdefault(path, set()).add(worker)
    assert set(workers) == set(files) and all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 2, workers   # and both workers had work
