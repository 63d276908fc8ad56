"""2 workers, Keras `fit`, SGD and Adagrad tables: the same losses and tables as one process.

Both runs happen in subprocesses (`fit_worker.py`, the `runs` fixture of conftest.py),
each with a hard time limit and its own process group; the two-worker run goes
through `npu_rec.launch`.
"""

import numpy as np
import pytest

from npu_rec.table._sharded import shard_of_numpy


@pytest.mark.timeout(600)
@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_each_step_loss_equals_one_process(runs, opt):
    single, workers = runs
    assert len(single[f"{opt}/loss"]) == 50
    np.testing.assert_allclose(workers[0][f"{opt}/loss"], single[f"{opt}/loss"], atol=1e-4)
    np.testing.assert_array_equal(workers[0][f"{opt}/loss"], workers[1][f"{opt}/loss"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_a_compiled_metric_equals_one_process_each_step_and_epoch(runs, opt):
    """`metrics=["mae"]`: the per-batch logs are the mean of the workers' values (Keras'
    reduction), the epoch's the metric over every worker's samples: with equal halves
    of each global batch, both are one process's value on the global batch."""
    single, workers = runs
    for key in (f"{opt}/mae", f"{opt}/step_mae", f"{opt}/step_loss"):
        assert len(single[key]) == 50 and np.all(np.isfinite(single[key]))
        for w in workers:
            np.testing.assert_allclose(w[key], single[key], atol=1e-4, err_msg=key)
    np.testing.assert_allclose(single[f"{opt}/step_loss"], single[f"{opt}/loss"], atol=1e-6)


@pytest.mark.timeout(600)
def test_a_training_step_makes_one_all_reduce(runs):
    """The dense gradients and the logs (loss and compiled metric) share one all-reduce;
    the tables' ids, rows and gradients take 4 all-to-alls (sizes, ids, rows, gradients)."""
    _, workers = runs
    for w in workers:
        assert int(w["adagrad/all_reduces"]) == 1
        assert int(w["adagrad/all_to_alls"]) == 4


@pytest.mark.timeout(600)
def test_an_evaluation_step_makes_one_all_reduce(runs):
    """Keras reduces each evaluation log with 2 all-reduces after the step; RecModel's
    step averages the loss and the compiled metric in one, after 3 all-to-alls (sizes,
    ids, rows)."""
    _, workers = runs
    for w in workers:
        assert int(w["sgd/eval_all_reduces"]) == 1
        assert int(w["sgd/eval_all_to_alls"]) == 3


@pytest.mark.timeout(600)
def test_evaluate_and_predict_equal_one_process(runs):
    single, workers = runs
    for w in workers:
        np.testing.assert_allclose(w["sgd/eval_loss"], single["sgd/eval_loss"], atol=1e-5)
        np.testing.assert_allclose(w["sgd/eval_mae"], single["sgd/eval_mae"], atol=1e-5)
        assert w["sgd/predict"].shape == single["sgd/predict"].shape == (128, 1)
        np.testing.assert_allclose(w["sgd/predict"], single["sgd/predict"], atol=1e-5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("table", ["user", "item"])
def test_union_of_worker_tables_equals_the_one_process_table(runs, opt, table):
    single, workers = runs
    name = f"{opt}/{table}_{opt}"
    keys = [w[f"{name}/keys"] for w in workers]
    assert not np.intersect1d(keys[0], keys[1]).size, "a key is held by both workers"
    for rank, k in enumerate(keys):
        assert np.all(shard_of_numpy(k, 2) == rank)
        assert 0.35 <= len(k) / len(single[f"{name}/keys"]) <= 0.65
    union = np.concatenate(keys)
    order = np.argsort(union)
    np.testing.assert_array_equal(union[order], single[f"{name}/keys"])
    fields = ["values", "counts", "last_seen"] + (["slot_accumulator"] if opt == "adagrad" else [])
    for field in fields:
        merged = np.concatenate([w[f"{name}/{field}"] for w in workers])[order]
        if field == "last_seen":  # wall-clock seconds of two processes: within the run
            assert np.all(np.abs(merged - single[f"{name}/{field}"]) < 600)
        else:
            np.testing.assert_allclose(merged, single[f"{name}/{field}"], atol=1e-4)


def _export(single, name):
    return {f: single[f"sgd/{name}/{f}"] for f in ("keys", "values", "counts")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("num_shards", [1, 3])
def test_two_worker_checkpoint_restores_in_one_process(runs, tmp_path, num_shards):
    import npu_rec
    from npu_rec.distribute import restore_tables

    single, _ = runs
    tables = [
        npu_rec.create_table(
            "user_sgd", 8, optimizer=npu_rec.optimizers.SGD(0.05), num_shards=num_shards
        ),
        npu_rec.create_table(
            "item_sgd",
            8,
            optimizer=npu_rec.optimizers.SGD(0.05),
            access_threshold=2,
            num_shards=num_shards,
        ),
    ]
    assert restore_tables(str(runs.directory / "ckpt_multi"), tables) == 50
    for table in tables:
        want, got = _export(single, table.name), table.export()
        np.testing.assert_array_equal(got["keys"], want["keys"])
        np.testing.assert_array_equal(got["counts"], want["counts"])
        np.testing.assert_allclose(got["values"], want["values"], atol=1e-4)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", ["user_sgd", "item_sgd"])
def test_one_process_checkpoint_restores_on_two_workers(runs, table):
    single, workers = runs
    want = _export(single, table)
    keys = [w[f"restored/{table}/keys"] for w in workers]
    for rank, k in enumerate(keys):
        assert np.all(shard_of_numpy(k, 2) == rank)
    order = np.argsort(np.concatenate(keys))
    for field in ("keys", "values", "counts"):
        merged = np.concatenate([w[f"restored/{table}/{field}"] for w in workers])[order]
        np.testing.assert_array_equal(merged, want[field])
