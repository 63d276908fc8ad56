"""Training from a Kafka topic: the position travels with the checkpoints of both front ends.

A message holds 3 rows (rows 3m..3m+2 in message m, at partition m % 4, offset m // 4;
row i carries `rid=i`): a batch of 8 rows ends inside a message, so saves land there. The
rows a model has trained on are compared with the rows before its saved position.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

ck = pytest.importorskip("confluent_kafka")

import npu_rec  # noqa: E402
from npu_rec import estimator as E  # noqa: E402
from npu_rec.data import KafkaSource, as_dataset, as_input_fn  # noqa: E402
from npu_rec.keras import RecModel, SparseEmbedding  # noqa: E402
from npu_rec.keras.callbacks import SparseCheckpoint  # noqa: E402
from npu_rec.training._data_position import load_position  # noqa: E402
from tests.kafka_broker import mock_broker, topic_with  # noqa: E402

BATCH = 8
PER_MESSAGE = 3


@pytest.fixture(scope="module")
def broker():
    with mock_broker() as address:
        yield address


def rows_topic(broker, n):
    lines = [f"{i % 2},{i},c{i % 13}" for i in range(n)]
    k = PER_MESSAGE
    return topic_with(broker, ["\n".join(lines[i : i + k]) for i in range(0, n, k)])


def partition(row: int) -> int:
    return row // PER_MESSAGE % 4


def source(broker, topic):
    return KafkaSource(
        topic,
        bootstrap_servers=broker,
        columns=["label", "rid", "c"],
        label="label",
        dense=["rid"],
        categorical=["c"],
        max_wait_ms=1500,
    )


def below(state: dict, n: int) -> list[int]:
    """The rows before a saved position in a topic of `n` rows (per partition: the messages
    before its offset and the first `rows` rows of the message at it), sorted. The topic's
    last message holds what is left of the rows (a partition read to its end has its offset
    past that message)."""
    out = []
    for p, end in state["offsets"].items():
        inside = int((state.get("rows") or {}).get(p, 0))
        for off in range(end + 1):
            first = (4 * off + int(p)) * PER_MESSAGE
            out += range(first, min(n, first + (PER_MESSAGE if off < end else inside)))
    return sorted(out)


# ----------------------------------------------------------------------------- Keras
class Recorder(keras.layers.Layer):
    """Appends the `rid` values of every training batch to `log` (adds zero)."""

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.extend = log.extend

    def call(self, rows, training=None):
        if not training:
            return tf.zeros_like(rows)

        def record(values):
            self.extend(int(v) for v in values.numpy())
            return 0.0

        done = tf.ensure_shape(tf.py_function(record, [rows], tf.float32), [])
        return tf.zeros_like(rows) * done


class Crash(keras.callbacks.Callback):
    """Raises after training batch `at` of the call (a kill: no save at the end)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.at:
            raise KeyboardInterrupt("killed")


def keras_run(broker, topic, directory, steps, log, *, workers=1, rank=0, crash_at=None):
    """A restarted Keras program: fresh tables, model, source and dataset; `steps` steps."""
    npu_rec.table._registry.clear()
    keras.utils.set_random_seed(0)
    rid = keras.Input(shape=(), name="rid")
    c = keras.Input(shape=(), dtype="int64", name="c")
    emb = SparseEmbedding("c", 4, optimizer=npu_rec.optimizers.Adagrad(0.1))(c)
    out = keras.layers.Dense(1, activation="sigmoid")(emb)
    out = out + keras.ops.expand_dims(Recorder(log)(rid), -1)
    model = RecModel({"rid": rid, "c": c}, out)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    src = source(broker, topic)
    ds = as_dataset(src, BATCH, num_sweeps=None, number_of_workers=workers, worker_rank=rank)
    ckpt = SparseCheckpoint(
        directory, save_freq=2, data_source=src, reading_position=ds.reading_position
    )
    callbacks = [ckpt] + ([Crash(crash_at)] if crash_at else [])
    try:
        model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    finally:
        ds.reading_position.stop()
        src.close()
    return ckpt


def keras_position(directory, step):
    return load_position(f"{directory}/state-{step:012d}.json")["data"]


def test_keras_restore_model_version_rewinds_the_offsets(broker, tmp_path):
    n = 160
    topic, directory = rows_topic(broker, n), str(tmp_path / "ckpt")
    npu_rec.init()
    first = []
    keras_run(broker, topic, directory, 8, first)
    assert sorted(first) == below(keras_position(directory, 8), n)

    npu_rec.shutdown()
    npu_rec.init(if_load=True, restore_model_version=4)
    again = []
    ckpt = keras_run(broker, topic, directory, 2, again)
    assert ckpt.restored_step == 4
    at4 = keras_position(directory, 4)
    assert at4["rows"]  # 32 rows: version 4 ends inside a message
    assert sorted(first[: 4 * BATCH]) == below(at4, n)
    # The rows after version 4's offsets, not after the newer version 8's.
    assert not set(again) & set(first[: 4 * BATCH])
    lineage = sorted(first[: 4 * BATCH] + again)
    assert lineage == below(keras_position(directory, 6), n)
    npu_rec.shutdown()


def test_keras_workers_read_disjoint_partitions_and_resume_after_a_kill(broker, tmp_path):
    """Two workers each save their own position; worker 1 is killed between saves and
    restarted: together the two lineages trained on every row once."""
    n = 96
    topic = rows_topic(broker, n)
    npu_rec.init()
    w0, w1, w1_killed = [], [], []
    keras_run(broker, topic, str(tmp_path / "w0"), 6, w0, workers=2, rank=0)
    with pytest.raises(KeyboardInterrupt):
        keras_run(broker, topic, str(tmp_path / "w1"), 6, w1_killed, workers=2, rank=1, crash_at=3)
    assert {partition(r) for r in w0} == {0, 2} and {partition(r) for r in w1_killed} <= {1, 3}
    npu_rec.shutdown()
    npu_rec.init(if_load=True)
    ckpt = keras_run(broker, topic, str(tmp_path / "w1"), 4, w1, workers=2, rank=1)
    assert ckpt.restored_step == 2  # the last save before the kill (inside a message)
    assert keras_position(str(tmp_path / "w1"), 2)["rows"]
    lineage1 = w1_killed[: 2 * BATCH] + w1
    assert sorted(w0 + lineage1) == list(range(n))
    assert sorted(lineage1) == below(keras_position(str(tmp_path / "w1"), 6), n)
    assert set(keras_position(str(tmp_path / "w1"), 6)["offsets"]) == {"1", "3"}
    npu_rec.shutdown()


# ------------------------------------------------------------------------- Estimator
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
    """Records the rows of each step; `crash_at`: raises after that step (a kill, no save)."""

    def __init__(self, seen, crash_at=None):
        self.seen, self.crash_at, self.steps = seen, crash_at, 0

    def begin(self):
        self._rid = tf.compat.v1.get_collection("rid")[0]

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._rid)

    def after_run(self, run_context, run_values):
        self.seen.extend(int(r) for r in np.ravel(run_values.results))
        self.steps += 1
        if self.steps == self.crash_at:
            raise KeyboardInterrupt("killed")


def estimator_run(broker, topic, model_dir, max_steps, seen, *, workers=1, rank=0, crash_at=None):
    src = source(broker, topic)
    est = E.NPUEstimator(
        _model_fn,
        config=E.NPURunConfig(
            model_dir=str(model_dir),
            save_checkpoints_steps=2,
            log_step_count_steps=None,
            save_summary_steps=None,
        ),
    )
    try:
        est.train(
            as_input_fn(src, BATCH, num_sweeps=None, number_of_workers=workers, worker_rank=rank),
            hooks=[_RecordIds(seen, crash_at)],
            max_steps=max_steps,
        )
    finally:
        src.close()


def test_estimator_restore_model_version_rewinds_the_offsets(broker, tmp_path):
    n = 160
    topic = rows_topic(broker, n)

    def offsets(step):
        return load_position(str(tmp_path / f"data_position-{step}.json"))

    npu_rec.shutdown()
    npu_rec.init()
    first = []
    estimator_run(broker, topic, tmp_path, 8, first)
    assert sorted(first) == below(offsets(8), n)
    npu_rec.shutdown()
    npu_rec.init(if_load=True, restore_model_version=4)
    again = []
    estimator_run(broker, topic, tmp_path, 6, again)
    assert len(again) == 2 * BATCH
    assert offsets(4)["rows"]  # 32 rows: version 4 ends inside a message
    assert not set(again) & set(first[: 4 * BATCH])
    assert sorted(first[: 4 * BATCH] + again) == below(offsets(6), n)
    npu_rec.shutdown()


def test_estimator_workers_read_disjoint_partitions_and_resume_after_a_kill(broker, tmp_path):
    n = 96
    topic = rows_topic(broker, n)

    def offsets(worker, step):
        return load_position(str(tmp_path / worker / f"data_position-{step}.json"))

    npu_rec.shutdown()
    npu_rec.init()
    w0, w1, w1_killed = [], [], []
    estimator_run(broker, topic, tmp_path / "w0", 6, w0, workers=2, rank=0)
    with pytest.raises(KeyboardInterrupt):
        estimator_run(broker, topic, tmp_path / "w1", 6, w1_killed, workers=2, rank=1, crash_at=3)
    assert {partition(r) for r in w0} == {0, 2} and {partition(r) for r in w1_killed} <= {1, 3}
    npu_rec.shutdown()
    npu_rec.init()
    estimator_run(broker, topic, tmp_path / "w1", 6, w1, workers=2, rank=1)
    lineage1 = w1_killed[: 2 * BATCH] + w1  # resumed from the save at step 2
    assert offsets("w1", 2)["rows"]  # (inside a message)
    assert sorted(w0 + lineage1) == list(range(n))
    assert sorted(lineage1) == below(offsets("w1", 6), n)
    assert set(offsets("w1", 6)["offsets"]) == {"1", "3"}
    npu_rec.shutdown()
