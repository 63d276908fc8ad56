"""Estimator checkpoints are committed versions: interrupted saves, damage, locks, rollbacks, keep."""

import json
import logging
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from npu_rec.checkpoint import CheckpointCorruptedError, CheckpointDirLockedError, VersionLog
from npu_rec.data import CsvSource, as_input_fn
from tests.helpers import hold_training_lock


def _model_fn(features, labels, mode):
    """A tiny model with one table and tf.compat.v1 dense variables."""
    table = npu_rec.create_table("c", 2, optimizer=npu_rec.optimizers.SGD(0.1))
    emb = npu_rec.sparse_lookup(
        table, tf.reshape(features["c"], [-1, 1]), is_training=mode == E.ModeKeys.TRAIN
    )
    w = tf.compat.v1.get_variable("w", [2, 1], initializer=tf.zeros_initializer())
    logits = tf.reshape(tf.matmul(tf.reduce_sum(emb, 1), w), [-1]) + tf.reduce_sum(emb, [1, 2])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == E.ModeKeys.EVAL:
        return E.EstimatorSpec(mode, loss=loss)
    train_op = E.sparse_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), tf.compat.v1.train.get_global_step()
    )
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _input_fn():
    rng = np.random.default_rng(0)
    c = rng.integers(0, 30, 4096).astype(np.int64)
    y = (c % 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"c": c}, y)).repeat().batch(8)


def _est(model_dir, **config):
    npu_rec.shutdown()
    config.setdefault("save_checkpoints_steps", 5)
    return E.NPUEstimator(
        _model_fn,
        config=E.NPURunConfig(
            model_dir=str(model_dir),
            log_step_count_steps=None,
            save_summary_steps=None,
            random_seed=1,
            **config,
        ),
    )


def _files(model_dir, pattern):
    return sorted(p.name for p in model_dir.glob(pattern))


class TableInvariantError(ValueError):
    """What a table's invariant check raises when its state is read for saving."""


@pytest.fixture
def failing_table_save(monkeypatch):
    """Makes reading a table's state for a save at or after `fail_from[0]` raise."""
    from npu_rec.table._sparse import SingleShardTable

    real = SingleShardTable.read_state
    fail = {"on": False}

    def read_state(self, *args, **kwargs):
        if fail["on"]:
            raise TableInvariantError(f"table {self.name!r}: index size != live rows")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SingleShardTable, "read_state", read_state)
    return fail


def test_a_failed_table_write_publishes_nothing_and_keeps_the_previous_version(
    tmp_path, failing_table_save
):
    _est(tmp_path).train(_input_fn, max_steps=5)
    before = {
        str(p.relative_to(tmp_path)): p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and "events" not in p.name
    }
    failing_table_save["on"] = True
    with pytest.raises(TableInvariantError):
        _est(tmp_path).train(_input_fn, max_steps=10)
    failing_table_save["on"] = False
    # Nothing of step 10 is published or left behind; TF's pointer was not moved.
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-5")
    assert _files(tmp_path, "model.ckpt-10*") == []
    assert _files(tmp_path / "tables", "*") == ["ckpt-000000000005.full.nrc"]
    for name, data in before.items():
        if name not in ("checkpoint", "graph.pbtxt"):
            assert (tmp_path / name).read_bytes() == data, name
    # The next run resumes from step 5 with no flag.
    est = _est(tmp_path)
    est.train(_input_fn, max_steps=10)
    assert est.latest_checkpoint().endswith("model.ckpt-10")


def test_a_kill_between_dense_and_tables_restarts_from_the_last_committed_version(tmp_path):
    est = _est(tmp_path)
    est.train(_input_fn, max_steps=5)
    # What a kill after saver.save(step 10) and before the tables leaves behind:
    # the dense files of step 10, TF's pointer on them, and temporary files.
    for name in os.listdir(tmp_path):
        if name.startswith("model.ckpt-5."):
            shutil.copy(tmp_path / name, tmp_path / name.replace("-5.", "-10."))
    tf.compat.v1.train.update_checkpoint_state(
        str(tmp_path), "model.ckpt-10", ["model.ckpt-5", "model.ckpt-10"]
    )
    (tmp_path / "tables" / "ckpt-000000000010.full.nrc.tmp-4242").write_bytes(b"x" * 100)
    (tmp_path / "model.ckpt-10_temp").mkdir()
    (tmp_path / "model.ckpt-10_temp" / "part-00000").write_bytes(b"y" * 100)
    est = _est(tmp_path)
    assert est.latest_checkpoint().endswith("model.ckpt-5")
    assert est.evaluate(_input_fn, steps=2)["global_step"] == 5
    est.train(_input_fn, max_steps=12)
    assert est.evaluate(_input_fn, steps=2)["global_step"] == 12
    assert not [p for p in tmp_path.rglob("*") if "tmp" in p.name or "_temp" in p.name]


def test_a_truncated_newest_table_file_falls_back_with_a_warning(tmp_path, caplog):
    _est(tmp_path).train(_input_fn, max_steps=10)
    newest = tmp_path / "tables" / "ckpt-000000000010.full.nrc"
    newest.write_bytes(newest.read_bytes()[:-40])
    with pytest.raises(CheckpointCorruptedError, match="ckpt-000000000010.full.nrc.*truncated"):
        _est(tmp_path, checkpoint_fallback=False).train(_input_fn, max_steps=15)
    with caplog.at_level(logging.WARNING):
        est = _est(tmp_path)
        est.train(_input_fn, max_steps=15)
    assert any(
        "skipping checkpoint version step 10" in r.getMessage()
        and "ckpt-000000000010.full.nrc" in r.getMessage()
        for r in caplog.records
    )
    assert est.evaluate(_input_fn, steps=1)["global_step"] == 15
    # The damaged version was moved aside, not deleted.
    assert list((tmp_path / "retired").rglob("ckpt-000000000010.full.nrc"))


def test_an_edited_data_position_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("label,c\n" + "".join(f"{i % 2},{i % 7}\n" for i in range(80)))

    def train(max_steps, **config):
        npu_rec.shutdown()
        source = CsvSource([str(path)], label="label", categorical=("c",))
        est = _est(tmp_path, **config)
        est.train(as_input_fn(source, 4, num_sweeps=None), max_steps=max_steps)

    train(5)
    position = tmp_path / "data_position-5.json"
    text = position.read_text()
    digit = text.index('"position": ') + len('"position": ')  # 20 rows read: make it 30
    position.write_text(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :])
    with pytest.raises(CheckpointCorruptedError, match="data_position-5.json"):
        train(10, checkpoint_fallback=False)


def test_a_second_trainer_fails_at_once_naming_the_holder(tmp_path):
    holder = hold_training_lock(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(CheckpointDirLockedError, match=f"pid {holder.pid} on host"):
            _est(tmp_path).train(_input_fn, max_steps=5)
        assert time.monotonic() - start < 30
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not list(tmp_path.glob("model.ckpt-*"))


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    (tmp_path / "npu_rec.lock").write_text(
        json.dumps({"pid": int(dead.stdout), "host": "h", "since": "then"})
    )
    with caplog.at_level(logging.WARNING):
        _est(tmp_path).train(_input_fn, max_steps=5)
    assert any(f"left by pid {int(dead.stdout)}" in r.getMessage() for r in caplog.records)


def test_a_rollback_retires_the_abandoned_branch(tmp_path):
    _est(tmp_path).train(_input_fn, max_steps=20)
    est = _est(tmp_path)
    npu_rec.init(if_load=True, restore_model_version=10, bind_cpu=False)
    est.train(_input_fn, max_steps=15)
    npu_rec.shutdown()
    est = _est(tmp_path)
    assert est.latest_checkpoint().endswith("model.ckpt-15")
    assert est.evaluate(_input_fn, steps=1)["global_step"] == 15
    est.train(_input_fn, max_steps=20)  # a new step 20, not the abandoned one
    assert _files(tmp_path / "tables", "*") == [
        f"ckpt-0000000000{s}.full.nrc" for s in ("05", 10, 15, 20)
    ]
    assert sorted(p.name for p in (tmp_path / "retired").rglob("*.nrc")) == [
        "ckpt-000000000015.full.nrc",
        "ckpt-000000000020.full.nrc",
    ]


def test_keep_checkpoint_max_counts_every_train_call_of_train_and_evaluate(tmp_path):
    """With keep_checkpoint_max=2, four train-and-evaluate intervals leave two versions."""
    est = _est(tmp_path, keep_checkpoint_max=2)
    E.train_and_evaluate(est, E.TrainSpec(_input_fn, max_steps=20), E.EvalSpec(_input_fn, steps=1))
    assert _files(tmp_path, "model.ckpt-*") == [
        "model.ckpt-15.data-00000-of-00001",
        "model.ckpt-15.index",
        "model.ckpt-20.data-00000-of-00001",
        "model.ckpt-20.index",
    ]
    assert _files(tmp_path / "tables", "*") == [
        "ckpt-000000000015.full.nrc",
        "ckpt-000000000020.full.nrc",
    ]
    assert len(_files(tmp_path / "commits", "*")) == 2
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "model.ckpt-15",
        "model.ckpt-20",
    ]
    assert est.evaluate(_input_fn, steps=1)["global_step"] == 20


def _make_legacy(model_dir):
    """Turns a model_dir into what npu_rec wrote before commit records."""
    shutil.rmtree(model_dir / "commits")
    for path in model_dir.glob("data_position-*.json"):
        path.write_text(json.dumps(json.loads(path.read_text())["payload"]))


def test_a_model_dir_written_before_commit_records_still_restores_and_trains(tmp_path):
    _est(tmp_path).train(_input_fn, max_steps=10)
    values = _est(tmp_path).get_variable_value("w")
    _make_legacy(tmp_path)
    # The defect of old model_dirs: dense step 15 written, its tables never were.
    for name in os.listdir(tmp_path):
        if name.startswith("model.ckpt-10."):
            shutil.copy(tmp_path / name, tmp_path / name.replace("-10.", "-15."))
    tf.compat.v1.train.update_checkpoint_state(str(tmp_path), "model.ckpt-15")
    est = _est(tmp_path)
    assert est.evaluate(_input_fn, steps=1)["global_step"] == 10  # read-only: no adoption
    np.testing.assert_array_equal(est.get_variable_value("w"), values)
    est.train(_input_fn, max_steps=20)
    # Versions 5 and 10 were adopted; the tables-less 15 was removed and saved anew.
    assert [v.step for v in VersionLog(str(tmp_path)).versions()] == [5, 10, 15, 20]
    assert (tmp_path / "tables" / "ckpt-000000000015.full.nrc").exists()
    assert est.evaluate(_input_fn, steps=1)["global_step"] == 20
