"""3 workers, Keras `fit` with admission, eviction and a table looked up twice per step.

The same losses, evaluation and tables as one process (`three_worker.py`, run in
subprocesses with hard time limits; the 3-worker run through `npu_rec.launch`).
"""

import os

import numpy as np
import pytest

from npu_rec.table._sharded import shard_of_numpy
from tests.distribute.conftest import run_scenario

_WORKER = os.path.join(os.path.dirname(__file__), "three_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("three")
    run_scenario(_WORKER, out, workers=3)
    return np.load(out / "single.npz"), [np.load(out / f"{r}.npz") for r in range(3)]


@pytest.mark.timeout(700)
def test_each_step_loss_and_the_evaluation_equal_one_process(runs):
    single, workers = runs
    assert len(single["loss"]) == 12
    for w in workers:
        np.testing.assert_allclose(w["loss"], single["loss"], atol=1e-4)
        np.testing.assert_allclose(w["eval_loss"], single["eval_loss"], atol=1e-5)


@pytest.mark.timeout(700)
@pytest.mark.parametrize("table", ["user3", "item3"])
def test_the_workers_tables_together_are_the_one_process_table(runs, table):
    single, workers = runs
    keys = [w[f"{table}/keys"] for w in workers]
    for rank, k in enumerate(keys):
        assert np.all(shard_of_numpy(k, 3) == rank), "a key is held by a worker not owning it"
    union = np.concatenate(keys)
    assert len(np.unique(union)) == len(union), "a key is held by two workers"
    order = np.argsort(union)
    np.testing.assert_array_equal(union[order], single[f"{table}/keys"])
    for field in ("values", "counts", "last_seen"):
        merged = np.concatenate([w[f"{table}/{field}"] for w in workers])[order]
        if field == "last_seen" and table == "item3":  # wall-clock seconds of two runs
            assert np.all(np.abs(merged - single[f"{table}/{field}"]) < 600)
        else:
            np.testing.assert_allclose(merged, single[f"{table}/{field}"], atol=1e-4)


@pytest.mark.timeout(700)
def test_eviction_frees_on_the_workers_together_what_one_process_frees(runs):
    single, workers = runs
    assert single["freed"].sum() > 0, "the scenario should evict"
    np.testing.assert_array_equal(sum(w["freed"] for w in workers), single["freed"])
