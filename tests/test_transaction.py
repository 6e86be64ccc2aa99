"""The output transaction (common/storage/transaction.py) on its own: claims, commits and every way back, with
files of the suite's own formats in temporary folders.  What every command does with it is
tests/test_contract.py."""

from __future__ import annotations

import json
import os
import pathlib
import signal

import h5py
import numpy as np
import pytest

from common.errors import NonFiniteOutput, Terminated, UserInputError
from common.storage import outputs, run_dirs, transaction
from common.storage.transaction import OutputTransaction, Producer
from conftest import tree_contents as tree_state

PRODUCER = Producer(command="cosmoflow.predict", application="cosmoflow", run="/runs/a", model_sha256="a" * 64)


def predictions(out, producer=PRODUCER, force=False, inputs=()) -> OutputTransaction:
    return OutputTransaction(producer, force, inputs).into(out, "predictions", "--out")


def write(out, names, producer=PRODUCER, **kwargs) -> None:
    txn = predictions(out, producer, **kwargs).plan(names)
    txn.check(names)
    with txn:
        for name in names:
            txn.json(name, {"name": name})


@pytest.fixture(autouse=True)
def no_hook():
    yield
    transaction.fault_hook = None


def test_a_new_nested_folder_is_claimed_committed_and_listed(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    write(out, ["one.json", "two.json"])
    marker = outputs.read_run_marker(out)
    assert marker["kind"] == "predictions" and marker["producer"]["model_sha256"] == "a" * 64
    assert set(marker["files"]) == {"one.json", "two.json", outputs.RUN_LOCK}
    assert sorted(p.name for p in out.iterdir()) == sorted([".hpc-dl-suite-run", ".hpc-dl-suite-run.lock",
                                                             "one.json", "two.json"])
    assert json.loads((out / "one.json").read_text())["written_by"] == outputs.provenance("cosmoflow.predict")


@pytest.mark.parametrize("phase", ["claimed", "staged", "commit"])
def test_a_failure_at_any_phase_leaves_the_tree_as_found(tmp_path, phase):
    out = tmp_path / "a" / "out"
    before_new = tree_state(tmp_path)
    transaction.fault_hook = lambda at, what: (_ for _ in ()).throw(RuntimeError("injected")) if at == phase else None
    with pytest.raises(RuntimeError, match="injected"):
        write(out, ["one.json", "two.json"])
    assert tree_state(tmp_path) == before_new   # the parents it created removed too
    transaction.fault_hook = None
    write(out, ["one.json", "two.json"])   # then a rerun of the same producer replaces its own outputs
    (out / "two.json").touch()
    before = tree_state(tmp_path)
    transaction.fault_hook = lambda at, what: (_ for _ in ()).throw(RuntimeError("injected")) if at == phase else None
    with pytest.raises(RuntimeError, match="injected"):
        write(out, ["one.json", "three.json"])
    assert tree_state(tmp_path) == before


def test_a_rerun_replaces_and_leaves_only_what_the_marker_lists(tmp_path):
    out = tmp_path / "out"
    write(out, ["one.json", "two.json"])
    write(out, ["two.json", "three.json"])
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["three.json", "two.json"]
    assert set(outputs.read_run_marker(out)["files"]) == {"two.json", "three.json", outputs.RUN_LOCK}


@pytest.mark.parametrize("other, words", [
    (Producer(command="cosmoflow.predict", application="cosmoflow", run="/runs/a", model_sha256="b" * 64),
     "another model sha256"),
    (Producer(command="cosmoflow.predict", application="cosmoflow", run="/runs/b", model_sha256="a" * 64),
     "another run"),
    (Producer(command="hep_cnn.predict", application="hep_cnn", run="/runs/a", model_sha256="a" * 64),
     "written by cosmoflow.predict"),
])
def test_a_folder_of_another_producer_is_refused_before_any_work(tmp_path, other, words):
    out = tmp_path / "out"
    write(out, ["one.json"])
    before = tree_state(tmp_path)
    with pytest.raises(UserInputError, match=words):
        predictions(out, other).check(["one.json"])
    assert tree_state(tmp_path) == before


def test_a_users_file_in_the_folder_or_at_a_name_is_refused(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError, match="holds files this suite did not write"):
        predictions(users).check(["one.json"])
    out = tmp_path / "out"
    write(out, ["one.json"])
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError, match="notes.txt: in --out .* not written by this suite"):
        predictions(out).check(["one.json"])


def test_an_input_is_never_an_output(tmp_path):
    out = tmp_path / "out"
    write(out, ["one.json"])
    link = tmp_path / "link.json"
    link.symlink_to(out / "one.json")
    with pytest.raises(UserInputError, match="inside its output folder"):
        predictions(out, inputs=[link]).check(["one.json"])
    figure = tmp_path / "curve.png"
    figure.write_bytes(b"")
    (tmp_path / "earlier.json").symlink_to(figure)
    loose = OutputTransaction(Producer("cosmoflow.learning_curve", "cosmoflow"), inputs=[tmp_path / "earlier.json"])
    with pytest.raises(UserInputError, match="also an input of this command"):
        loose.check([str(figure)])


def test_loose_files_replace_only_the_same_commands(tmp_path):
    path = tmp_path / "result.json"
    bench = OutputTransaction(Producer("common.tools.bench"))
    bench.check([str(path)])
    with bench:
        bench.json(path, {"rate": 1.0})
    information = OutputTransaction(Producer("cosmoflow.information", "cosmoflow"))
    with pytest.raises(UserInputError, match="written by common.tools.bench, not cosmoflow.information"):
        information.check([str(path)])
    path.write_text("{}")
    with pytest.raises(UserInputError, match="not written by this suite"):
        OutputTransaction(Producer("common.tools.bench")).check([str(path)])
    forced = OutputTransaction(Producer("common.tools.bench"), force=True)
    forced.check([str(path)])
    with forced:
        forced.json(path, {"rate": 2.0})
    assert json.loads(path.read_text())["rate"] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_nonfinite_values_are_refused_naming_the_input(tmp_path):
    out = tmp_path / "out"
    cases = [
        lambda txn: txn.json("a.json", {"boxes": [{"lat_min": float("-inf")}]}),
        lambda txn: txn.csv("a.csv", ["step", "score"], [[0, 0.5], [1, float("nan")]]),
        lambda txn: txn.npz("a.npz", scores=np.array([0.0, np.nan])),
    ]
    for case in cases:
        txn = predictions(out)
        with pytest.raises(NonFiniteOutput, match=r"^/data/x.nc: a\.\w+ would hold a NaN or an infinity"):
            with txn, txn.reading("/data/x.nc"):
                case(txn)
        assert not out.exists()

    def h5(txn):
        with txn.path("a.h5") as temporary, h5py.File(temporary, "w") as handle:
            handle["group/scores"] = np.array([[0.0, 1.0], [np.inf, 2.0]], np.float32)

    txn = predictions(out)
    with pytest.raises(NonFiniteOutput, match="its dataset group/scores"):
        with txn, txn.reading("/data/x.nc"):
            h5(txn)
    assert not out.exists()


def test_a_signal_at_the_commit_waits_for_it_to_complete(tmp_path):
    """SIGINT and SIGTERM are held back during the commit: the folder is complete, then the signal acts."""
    out = tmp_path / "out"
    sent = []

    def hook(phase, what):
        if phase == "commit" and not sent:
            sent.append(what)
            os.kill(os.getpid(), signal.SIGINT)

    transaction.fault_hook = hook
    with pytest.raises(KeyboardInterrupt):
        write(out, ["one.json", "two.json"])
    assert sent and sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["one.json", "two.json"]
    assert transaction.last_outcome == "its outputs were complete before it"


def test_sigterm_before_the_commit_rolls_back(tmp_path):
    out = tmp_path / "out"

    def hook(phase, what):
        if phase == "staged":
            os.kill(os.getpid(), signal.SIGTERM)

    transaction.fault_hook = hook
    with pytest.raises(Terminated):
        write(out, ["one.json", "two.json"])
    assert not out.exists() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_commit_killed_half_way_is_rolled_back_by_the_next_claim(tmp_path):
    """What SIGKILL between two renames leaves (a journal in a staging folder whose lock is free): the next claim
    puts the replaced file and the marker back and removes the new one, then goes on."""
    out = tmp_path / "out"
    write(out, ["one.json", "two.json"])
    before = tree_state(out)
    txn = predictions(out).plan(["one.json", "three.json"])
    txn.check(txn._planned)
    txn.claim()
    txn.json("one.json", {"new": True})
    txn.json("three.json", {"new": True})
    staging = pathlib.Path(txn.staging_folder)
    txn._write_journals()   # the commit as far as its first rename, then the process "dies"
    os.rename(out / "one.json", staging / "backup" / "one.json")
    os.rename(staging / "files" / "one.json", out / "one.json")
    os.close(txn.owned.staging_fd)
    txn.owned.lock.release()
    assert json.loads((out / "one.json").read_text()).get("new")
    rerun = predictions(out).plan(["two.json"])
    rerun.check(["two.json"])
    rerun.claim()
    assert not staging.exists()
    assert json.loads((out / "one.json").read_text()) == json.loads(before[str(out / "one.json")][3])
    assert not (out / "three.json").exists()
    rerun.rollback()
    lock = str(out / outputs.RUN_LOCK)   # says who held the folder last: the killed command, then the rerun
    assert {k: v for k, v in tree_state(out).items() if k != lock} == {k: v for k, v in before.items() if k != lock}


def test_a_contribution_to_a_run_folder_is_listed_under_its_command(tmp_path):
    run = tmp_path / "run"
    run_dirs.mark_run_dir(run, "cosmoflow", files=["config.yaml", "model.keras"],
                         producer=Producer("cosmoflow.train", "cosmoflow").record())
    (run / "config.yaml").write_text("{}")
    evaluate = OutputTransaction(Producer("cosmoflow.evaluate", "cosmoflow", run=str(run)))
    evaluate.into(run, "run", "--run-dir", contribution=True)
    evaluate.check(["metrics.json"])
    with evaluate:
        evaluate.json("metrics.json", {"mae": 0.1})
    marker = outputs.read_run_marker(run)
    assert marker["contributions"]["cosmoflow.evaluate"]["files"] == ["metrics.json"]
    assert "metrics.json" in marker["files"] and "config.yaml" in marker["files"]
    hep = OutputTransaction(Producer("hep_cnn.evaluate", "hep_cnn", run=str(run)))
    with pytest.raises(UserInputError, match="a run of cosmoflow; hep_cnn.evaluate writes only into runs of hep_cnn"):
        hep.into(run, "run", "--run-dir", contribution=True).check(["metrics.json"])
    tool = OutputTransaction(Producer("cosmoflow.information", "cosmoflow"))
    with pytest.raises(UserInputError, match="a file of cosmoflow.evaluate in this run.s folder"):
        tool.check([str(run / "metrics.json")])


def test_a_path_through_a_folder_not_yet_made_is_taken_as_it_will_be(tmp_path):
    """``new/../x``: checked as ``x`` (what the file system resolves once ``new`` is made), so an existing file or
    folder there is found, and ``new`` is never made."""
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    sneaky = tmp_path / "new" / ".." / "users" / "notes.txt"
    with pytest.raises(UserInputError, match=f"{users / 'notes.txt'}: exists and was not written by this suite"):
        OutputTransaction(Producer("cosmoflow.information", "cosmoflow")).check([sneaky])
    with pytest.raises(UserInputError, match="holds files this suite did not write"):
        predictions(tmp_path / "new" / ".." / "users").check()
    assert not (tmp_path / "new").exists() and (users / "notes.txt").read_text() == "mine"


def test_another_commands_file_in_a_run_folder_is_never_replaced_even_when_gone_or_forced(tmp_path):
    run = tmp_path / "run"
    run_dirs.mark_run_dir(run, "cosmoflow", files=["config.yaml"], producer=Producer("cosmoflow.train", "cosmoflow").record())
    evaluate = OutputTransaction(Producer("cosmoflow.evaluate", "cosmoflow", run=str(run)))
    evaluate.into(run, "run", "--run-dir", contribution=True)
    evaluate.check(["metrics.json"])
    with evaluate:
        evaluate.json("metrics.json", {"mae": 0.1})
    (run / "metrics.json").unlink()   # gone, but the marker says whose it was
    for force in (False, True):
        with pytest.raises(UserInputError, match="a file of cosmoflow.evaluate in this run's folder"):
            OutputTransaction(Producer("cosmoflow.information", "cosmoflow"), force).check([run / "metrics.json"])
    with pytest.raises(UserInputError, match="a file of cosmoflow.train"):
        OutputTransaction(Producer("common.tools.bench"), force=True).check([run / "config.yaml"])


def test_an_output_folder_inside_another_folder_of_the_suite_or_inside_an_input_is_refused(tmp_path):
    out = tmp_path / "out"
    write(out, ["one.json"])
    with pytest.raises(UserInputError, match=f"inside {out}, which holds a trained model's predictions"):
        predictions(out / "sub").check()
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(UserInputError, match=f"inside {data}, a folder this command reads"):
        predictions(data / "predictions", inputs=[data]).check()
    with pytest.raises(UserInputError, match=f"inside {data}, a folder this command reads"):
        OutputTransaction(Producer("hep_cnn.maxima"), force=True, inputs=[data]).check([data / "maxima.json"])


def test_a_file_given_twice_through_a_hard_link_is_refused(tmp_path):
    from common.storage.sample_files import list_inputs

    (tmp_path / "a.h5").write_bytes(b"x")
    os.link(tmp_path / "a.h5", tmp_path / "b.h5")
    with pytest.raises(UserInputError, match="given twice as --input"):
        list_inputs([tmp_path / "a.h5", tmp_path / "b.h5"], ("*.h5",), "sample", "--input")
