"""2 workers, Keras `fit`, tables with `not_admitted="hashed"`: the same run as one process.

`fallback_worker.py` (run by `keras_worker.py`) trains two hashed tables (SGD
float32; RowWiseAdagrad with bfloat16 rows) and a table without a fallback for 30
steps, once in one process on the whole global batches and once on 2 workers
through `npu_rec.launch` (subprocesses with hard time limits). Every step's loss,
the evaluation, the union of the workers' keys and rows, and every worker's copy
of each fallback must equal the one process's; a 2-worker checkpoint restores the
fallback in one process.
"""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.table._sharded import shard_of_numpy
from tests.distribute.conftest import scenario_runs

TABLES = ("user_fb", "item_fb", "plain")


@pytest.fixture(scope="module")
def runs(keras_scenarios):
    return scenario_runs(keras_scenarios, "fallback")


@pytest.mark.timeout(600)
def test_each_step_loss_and_the_evaluation_equal_one_process(runs):
    single, workers, _ = runs
    assert len(single["loss"]) == 30
    np.testing.assert_allclose(workers[0]["loss"], single["loss"], atol=1e-5)
    np.testing.assert_array_equal(workers[0]["loss"], workers[1]["loss"])
    for w in workers:
        np.testing.assert_allclose(w["eval_loss"], single["eval_loss"], atol=1e-5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", ["user_fb", "item_fb"])
def test_every_worker_holds_the_one_process_fallback(runs, table):
    single, workers, _ = runs
    fields = [k for k in single.files if k.startswith(f"{table}/fallback/")]
    assert f"{table}/fallback/values" in fields and f"{table}/fallback/step" in fields
    assert int(single[f"{table}/fallback/step"]) == 30
    for field in fields:
        np.testing.assert_array_equal(workers[0][field], workers[1][field])
        np.testing.assert_allclose(workers[0][field], single[field], atol=1e-5)
    # The fallback was trained: it moved away from its initial rows on most buckets.
    assert int(single[f"{table}/fallback/step"]) > 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", TABLES)
def test_union_of_worker_tables_equals_the_one_process_table(runs, table):
    single, workers, _ = runs
    keys = [w[f"{table}/keys"] for w in workers]
    for rank, k in enumerate(keys):
        assert np.all(shard_of_numpy(k, 2) == rank)
    order = np.argsort(np.concatenate(keys))
    np.testing.assert_array_equal(np.concatenate(keys)[order], single[f"{table}/keys"])
    for field in ("counts", "values"):
        merged = np.concatenate([w[f"{table}/{field}"] for w in workers])[order]
        np.testing.assert_allclose(merged, single[f"{table}/{field}"], atol=1e-5)


@pytest.mark.timeout(600)
def test_a_two_worker_checkpoint_restores_the_fallback_in_one_process(runs):
    from npu_rec.distribute import restore_tables

    single, _, out = runs
    tables = [
        npu_rec.create_table(
            "user_fb",
            8,
            optimizer=npu_rec.optimizers.SGD(0.05),
            access_threshold=3,
            not_admitted="hashed",
            fallback_buckets=64,
            num_shards=3,
        ),
        npu_rec.create_table(
            "item_fb",
            4,
            optimizer=npu_rec.optimizers.RowWiseAdagrad(0.05),
            access_threshold=2,
            not_admitted="hashed",
            fallback_buckets=32,
            value_dtype="bfloat16",
        ),
    ]
    assert restore_tables(str(out / "fallback_ckpt_multi"), tables) == 30
    for table in tables:
        got = table.read_state()
        for field in ("fallback/values", "fallback/step", "keys", "counts"):
            want = single[f"{table.name}/{field}"]
            np.testing.assert_allclose(np.asarray(got[field], np.float64), want, atol=1e-5)


def test_a_worker_sharded_hashed_table_restores_its_keys_and_the_whole_fallback(tmp_path):
    """One process standing in for worker 1 of 3 (no exchange needed to restore)."""
    from npu_rec.distribute import Exchange, WorkerShardedTable
    from npu_rec.table import _fallback, _registry
    from npu_rec.table._config import TableConfig
    from npu_rec.table._fused import select_backend

    kwargs = dict(
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=2,
        not_admitted="hashed",
        fallback_buckets=16,
    )
    one = npu_rec.create_table("wfb", 4, **kwargs)
    ids = tf.constant(np.arange(200) % 120, tf.int64)
    npu_rec.sparse_lookup(one, ids)
    one.apply_gradients(ids, tf.ones([200, 4]))
    one.save(str(tmp_path / "t.nrc"))
    want = one.read_state()
    _registry.clear()
    config = TableConfig(name="wfb", dim=4, capacity=1024, **kwargs)
    table = WorkerShardedTable(config, Exchange(3, 1), select_backend())
    _fallback.attach(table)
    assert {id(v) for v in table.fallback.variables()} <= {id(v) for v in table.variables()}
    table.restore(str(tmp_path / "t.nrc"))
    got = table.read_state()
    mine = shard_of_numpy(want["keys"], 3) == 1
    np.testing.assert_array_equal(got["keys"], want["keys"][mine])
    np.testing.assert_array_equal(got["values"], want["values"][mine])
    for field in ("fallback/values", "fallback/slot/accumulator", "fallback/step"):
        np.testing.assert_array_equal(got[field], want[field])


class _TwoEqualWorkers:
    """Stands in for a worker-sharded table whose 2 workers had the same batch."""

    def __init__(self, table, flag):
        self.fallback, self.flag = table.fallback, flag

    def gather_fallback_gradients(self, parts):
        return [(tf.concat([b, b], 0), tf.concat([g, g], 0)) for b, g in parts]

    def update_condition(self):
        return self.flag


@pytest.mark.parametrize("flag", [None, True, False])
def test_the_gathered_sums_of_every_worker_step_each_copy_once_unless_the_step_is_skipped(flag):
    """`apply_all` sums every worker's bucket sums; a skipped step (loss scaling) leaves it."""
    from npu_rec.table import _fallback
    from npu_rec.table._fallback import bucket_of_numpy

    table = npu_rec.create_table(
        f"stub_{flag}",
        2,
        optimizer=npu_rec.optimizers.SGD(0.5),
        access_threshold=3,
        not_admitted="hashed",
        fallback_buckets=4,
    )
    before = table.fallback.values.numpy().copy()
    keys = tf.constant([10, 11, 12], tf.int64)
    grads = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    stub = _TwoEqualWorkers(table, None if flag is None else tf.constant(flag))
    _fallback.apply_all([(stub, keys, tf.constant([-1, 7, -1], tf.int64), grads)])
    want = before.copy()
    if flag is not False:
        for key, g in ((10, [1.0, 2.0]), (12, [5.0, 6.0])):  # key 11 has a row
            want[bucket_of_numpy([key], 4)[0]] -= 0.5 * 2 * np.array(g)
    np.testing.assert_allclose(table.fallback.values.numpy(), want, rtol=1e-6)
    assert int(table.fallback.step.numpy()) == (0 if flag is False else 1)
