"""Hybrid mode with 4 real Horovod ranks in 2 groups of 2."""

import numpy as np
import pytest

from conftest import REPO, run_python

pytestmark = pytest.mark.horovod


def test_groups_synchronous_inside_asynchronous_across(tmp_path):
    run_python([str(REPO / "tests/workers/hybrid_groups.py"), str(tmp_path)], ranks=4, timeout=300)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(4)]
    # Within a group: identical weights after every step.
    np.testing.assert_array_equal(ranks[0]["kernels"], ranks[1]["kernels"])
    np.testing.assert_array_equal(ranks[2]["kernels"], ranks[3]["kernels"])
    # Across groups they drift apart between exchanges...
    gap = np.linalg.norm(ranks[0]["kernels"] - ranks[2]["kernels"], axis=1)
    assert np.all(gap[:4] > 0)
    applied = [int(s) for s in ranks[0]["applied"]]
    assert len(applied) >= 5, applied
    # ...each exchange pulls them together (only the steps since the snapshot keep them apart)...
    gap_before = np.linalg.norm(ranks[0]["before"] - ranks[2]["before"], axis=1)
    assert all(gap[s - 1] < gap_before[s - 1] for s in applied), (applied, gap_before, gap)
    # ...and they stay together although each group's data pulls towards weights OFFSET apart.
    offset = np.linalg.norm(ranks[0]["offset"])
    assert gap[20:].max() < 0.6 * offset, (gap, offset)
    # Staleness is bounded: an exchange started at step s is applied by step s + 4 - 1 + 1.
    for group in (ranks[0], ranks[2]):
        for index, step in enumerate(int(s) for s in group["applied"]):
            assert step <= 4 * (index + 1) + 4, group["applied"]
    # The saved consensus is the same everywhere, and training converged to the middle of the two.
    for r in ranks[1:]:
        np.testing.assert_allclose(r["final"], ranks[0]["final"], rtol=1e-6)
    assert np.linalg.norm(ranks[0]["final"] - ranks[0]["middle"]) < 0.25 * offset


def test_trainer_in_hybrid_mode(tiny_cosmo_data, tmp_path):
    import json

    from conftest import tiny_cosmo_overrides
    run_dir = tmp_path / "run"
    result = run_python(["-m", "cosmoflow.train", "--config", str(REPO / "configs/cosmoflow/demo.yaml"),
                         *tiny_cosmo_overrides(tiny_cosmo_data, epochs=2, batch_size=2),
                         "--set", "distributed.groups=2", "--set", "distributed.exchange_every=2",
                         "--output-dir", str(run_dir)], ranks=4, timeout=300)
    assert "4 rank(s) [horovod]" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 4 and summary["epochs_completed"] == 2


def test_groups_must_divide_the_ranks(tiny_cosmo_data, tmp_path):
    from conftest import tiny_cosmo_overrides
    result = run_python(["-m", "cosmoflow.train", "--config", str(REPO / "configs/cosmoflow/demo.yaml"),
                         *tiny_cosmo_overrides(tiny_cosmo_data), "--set", "distributed.groups=3",
                         "--output-dir", str(tmp_path / "run")], ranks=2, check=False)
    assert result.returncode != 0 and "distributed.groups=3 does not divide the 2 ranks" in result.stderr
