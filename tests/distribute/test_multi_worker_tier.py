"""Tiered tables on 2 workers: the same run as one process with the tables in memory.

`tier_worker.py` (run by `keras_worker.py`) trains two tables for 12 steps, once in
one process with the tables in memory and once on 2 workers with each worker's
shard tiered (`memory_rows` of 4 and 3 rows per worker, so every step promotes and
demotes; worker 0 on the default lookup path, worker 1 on the stock path) through
`npu_rec.launch` (subprocesses with hard time limits). Every step's loss, the
evaluation, the union of the workers' keys, rows, counts and slots, and each
worker's copy of the fallback must equal the one process's; both workers keep
their segment files in their own directory of the one `ssd_path` while both run,
and remove them at exit; the 2-worker checkpoint restores in one process, into
in-memory and tiered tables.
"""

import os
import shutil

import numpy as np
import pytest

import npu_rec
from npu_rec.table._sharded import shard_of_numpy
from tests.distribute.conftest import scenario_runs

TABLES = ("user_t", "item_t")
ATOL = 1e-5
HAVE_CXX = shutil.which(os.environ.get("CXX") or "g++") is not None


@pytest.fixture(scope="module")
def runs(keras_scenarios):
    return scenario_runs(keras_scenarios, "tier")


@pytest.mark.timeout(600)
def test_each_step_loss_and_the_evaluation_equal_one_process_in_memory(runs):
    single, workers, _ = runs
    assert len(single["loss"]) == 12
    for w in workers:
        np.testing.assert_allclose(w["loss"], single["loss"], atol=ATOL)
        np.testing.assert_allclose(w["eval_loss"], single["eval_loss"], atol=ATOL)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", TABLES)
def test_every_worker_shard_is_tiered_and_every_step_moved_rows(runs, table):
    _, workers, _ = runs
    backends = [str(w[f"{table}/backend"]) for w in workers]
    assert backends == ["kernels+tier" if HAVE_CXX else "stock+tier", "stock+tier"]
    for w in workers:
        assert int(w[f"{table}/memory_rows"]) == {"user_t": 4, "item_t": 3}[table]
        assert int(w[f"{table}/tier/steps"]) >= 12
        # Every step's batch holds more keys than memory: rows went to disk and back.
        assert int(w[f"{table}/tier/promotions"]) >= 12
        assert int(w[f"{table}/tier/demotions"]) >= 12
        assert int(w[f"{table}/tier/cold_keys"]) > 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", TABLES)
def test_union_of_worker_tables_equals_the_one_process_table(runs, table):
    single, workers, _ = runs
    keys = [w[f"{table}/keys"] for w in workers]
    for rank, k in enumerate(keys):
        assert np.all(shard_of_numpy(k, 2) == rank), "a key is held by a worker not owning it"
    union = np.concatenate(keys)
    assert len(np.unique(union)) == len(union), "a key is held by two workers"
    order = np.argsort(union)
    want_order = np.argsort(single[f"{table}/keys"])
    np.testing.assert_array_equal(union[order], single[f"{table}/keys"][want_order])
    slots = [f for f in single.files if f.startswith(f"{table}/slot/")]
    assert slots
    for field in ("values", "counts", "last_seen", *[s[len(table) + 1 :] for s in slots]):
        merged = np.concatenate([w[f"{table}/{field}"] for w in workers])[order]
        want = single[f"{table}/{field}"][want_order]
        if field == "last_seen":  # wall-clock seconds of two runs
            assert np.all(np.abs(merged - want) < 600)
        else:
            np.testing.assert_allclose(merged, want, atol=ATOL, err_msg=field)


@pytest.mark.timeout(600)
def test_every_worker_holds_the_one_process_fallback(runs):
    single, workers, _ = runs
    fields = [k for k in single.files if k.startswith("item_t/fallback/")]
    assert "item_t/fallback/values" in fields and int(single["item_t/fallback/step"]) == 12
    for field in fields:
        np.testing.assert_array_equal(workers[0][field], workers[1][field])
        np.testing.assert_allclose(workers[0][field], single[field], atol=ATOL)


@pytest.mark.timeout(600)
def test_each_worker_keeps_its_segments_in_its_own_directory_of_the_one_ssd_path(runs):
    _, workers, out = runs
    ssd = str(out / "ssd")
    dirs = [str(d) for w in workers for t in TABLES for d in w[f"{t}/dirs"]]
    assert len(set(dirs)) == 4 and all(os.path.dirname(d) == ssd for d in dirs)
    for w in workers:
        for t in TABLES:
            assert w[f"{t}/dirs_exist"].all()
        # Each worker saw the other's directories alive next to its own (none deleted).
        assert sorted(os.path.basename(d) for d in dirs) == sorted(w["ssd_entries"].tolist())
    assert os.listdir(ssd) == []  # removed by each worker at exit


def _tables(tmp_path, tiered: bool):
    def tier(rows):
        return {"memory_rows": rows, "ssd_path": str(tmp_path / "ssd1")} if tiered else {}

    return [
        npu_rec.create_table("user_t", 8, optimizer=npu_rec.optimizers.Adagrad(0.05), **tier(5)),
        npu_rec.create_table(
            "item_t",
            4,
            optimizer=npu_rec.optimizers.Adam(0.01),
            access_threshold=2,
            not_admitted="hashed",
            fallback_buckets=16,
            **tier(4),
        ),
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("tiered", [False, True])
def test_the_two_worker_checkpoint_restores_in_one_process(runs, tmp_path, tiered):
    from npu_rec.distribute import restore_tables
    from npu_rec.table import _registry

    single, _, out = runs
    _registry.clear()
    tables = _tables(tmp_path, tiered)
    try:
        assert restore_tables(str(out / "tier_ckpt_multi"), tables) == 12
        for table in tables:
            got = table.read_state()
            name = table.name
            order = np.argsort(got["keys"])
            want_order = np.argsort(single[f"{name}/keys"])
            np.testing.assert_array_equal(got["keys"][order], single[f"{name}/keys"][want_order])
            for field in ("values", "counts", *[f for f in got if f.startswith("slot/")]):
                np.testing.assert_allclose(
                    np.asarray(got[field], np.float64)[order],
                    single[f"{name}/{field}"][want_order],
                    atol=ATOL,
                    err_msg=field,
                )
            if name == "item_t":
                np.testing.assert_allclose(
                    got["fallback/values"], single["item_t/fallback/values"], atol=ATOL
                )
            if tiered:
                assert table.tier_stats()["cold_keys"] > 0
    finally:
        _registry.clear()
