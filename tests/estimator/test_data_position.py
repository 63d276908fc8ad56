"""The reading position of `npu_rec.data.as_input_fn` travels with Estimator checkpoints."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from npu_rec.data import CsvSource, as_input_fn

ROWS, BATCH = 80, 4


@pytest.fixture
def csv_path(tmp_path):
    path = tmp_path / "rows.csv"
    rng = np.random.default_rng(0)
    lines = ["label,rid,c"] + [
        f"{rng.integers(0, 2)},{i},{rng.integers(0, 10)}" for i in range(ROWS)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _model_fn(features, labels, mode):
    table = npu_rec.create_table("c", 2, optimizer=npu_rec.optimizers.SGD(0.1))
    emb = npu_rec.sparse_lookup(table, tf.reshape(features["c"], [-1, 1]))
    w = tf.compat.v1.get_variable("w", [1], initializer=tf.zeros_initializer())
    logits = tf.reduce_sum(emb, [1, 2]) + w * tf.reshape(features["rid"], [-1]) * 0.0
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    tf.compat.v1.add_to_collection("rid", features["rid"])
    train_op = E.sparse_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), tf.compat.v1.train.get_global_step()
    )
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


class _RecordIds(tf.compat.v1.train.SessionRunHook):
    """Records the row ids each step trains on; `crash_at` simulates a kill."""

    def __init__(self, seen, crash_at=None):
        self.seen, self.crash_at = seen, crash_at

    def begin(self):
        self._rid = tf.compat.v1.get_collection("rid")[0]
        self._step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._rid)

    def after_run(self, run_context, run_values):
        self.seen.extend(int(r) for r in np.ravel(run_values.results))
        step = int(run_context.session.run(self._step))  # after this run's increment
        if self.crash_at is not None and step == self.crash_at:
            raise KeyboardInterrupt("killed")  # no end(): no checkpoint at this step


def _train(csv_path, model_dir, max_steps, seen, crash_at=None, accelerate=None):
    """A new source, input_fn and NPUEstimator, as a restarted process would build."""
    npu_rec.shutdown()
    source = CsvSource([csv_path], label="label", dense=("rid",), categorical=("c",))
    exp = None if accelerate is None else E.ExperimentalConfig(accelerate_train_mode=accelerate)
    est = E.NPUEstimator(
        _model_fn,
        config=E.NPURunConfig(
            model_dir=str(model_dir),
            save_checkpoints_steps=5,
            log_step_count_steps=None,
            save_summary_steps=None,
            experimental_config=exp,
        ),
    )
    est.train(
        as_input_fn(source, BATCH, num_sweeps=None),
        hooks=[_RecordIds(seen, crash_at)],
        max_steps=max_steps,
    )


def test_stop_and_resume_neither_loses_nor_repeats_a_sample(tmp_path, csv_path):
    whole = []
    _train(csv_path, tmp_path / "one", 12, whole)
    assert whole == list(range(48))
    first, second = [], []
    _train(csv_path, tmp_path / "two", 7, first)  # saves at 5 and (end) at 7
    _train(csv_path, tmp_path / "two", 12, second)
    assert first + second == whole
    assert sorted(p.name for p in (tmp_path / "two").glob("data_position-*.json")) == [
        "data_position-10.json",
        "data_position-12.json",
        "data_position-5.json",
        "data_position-7.json",
    ]


def test_killed_run_rereads_only_the_samples_after_the_last_checkpoint(tmp_path, csv_path):
    killed, resumed = [], []
    with pytest.raises(KeyboardInterrupt):
        _train(csv_path, tmp_path, 12, killed, crash_at=8)  # last checkpoint: step 5
    assert killed == list(range(8 * BATCH))
    _train(csv_path, tmp_path, 12, resumed)
    assert resumed == list(range(5 * BATCH, 12 * BATCH))


def test_precision_switch_session_continues_at_the_next_sample(tmp_path, csv_path):
    """The float32 session after the switch (step 6) reads on from the hand-over."""
    seen = []
    _train(csv_path, tmp_path, 12, seen, accelerate="fast1|step|0.5")
    assert seen == list(range(48))
