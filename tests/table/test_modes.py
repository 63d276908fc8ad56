"""The same small model trains to the same weights in eager, tf.function and v1 graph mode."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.table import _registry as _table_registry

STEPS, BATCH, EVICT_EVERY = 6, 8, 3


def _batches():
    rng = np.random.default_rng(7)
    for step in range(STEPS):
        ids_a = rng.integers(0, 30, size=(BATCH, 2)).astype(np.int64)
        lengths = rng.integers(0, 4, size=BATCH)
        ids_b = rng.integers(0, 20, size=int(lengths.sum())).astype(np.int64)
        label = rng.integers(0, 2, size=(BATCH,)).astype(np.float32)
        ts = np.full([BATCH], 100 + 10 * step, np.int64)
        yield ids_a, (ids_b, lengths), label, ts


def _make():
    ta = npu_rec.create_table(
        "a",
        4,
        optimizer=npu_rec.optimizers.Adagrad(0.2),
        access_threshold=2,
        eviction_threshold=15,
        dynamic_expansion=True,
        capacity=4,
    )
    tb = npu_rec.create_table("b", 4, optimizer=npu_rec.optimizers.Adam(0.05))
    w = tf.Variable(tf.linspace(-0.5, 0.5, 8)[:, None], name="w")
    return ta, tb, w


def _loss(ta, tb, w, ids_a, ragged_b, label, ts):
    ea = npu_rec.sparse_lookup(ta, ids_a, timestamps=ts)  # [B, 2, 4]
    eb = npu_rec.sparse_lookup(tb, ragged_b, combiner="mean")  # [B, 4]
    x = tf.concat([tf.reduce_sum(ea, 1), eb], 1)
    logits = tf.squeeze(tf.matmul(x, w), 1)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))


def _step_fn(ta, tb, w):
    def step(ids_a, ids_b, lengths, label, ts):
        ragged = tf.RaggedTensor.from_row_lengths(ids_b, lengths)
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            loss = _loss(ta, tb, w, ids_a, ragged, label, ts)
        grads = tape.gradient(loss, [w] + [r.embeddings for r in recs])
        npu_rec.apply_recorded_gradients(recs, grads[1:])
        w.assign_sub(0.1 * grads[0])
        return loss

    return step


def _state(ta, tb, w):
    return ta.export(), tb.export(), w.numpy()


def _train_eager(compiled):
    _table_registry.clear()
    ta, tb, w = _make()
    step = _step_fn(ta, tb, w)
    if compiled:
        step = tf.function(step)
    for i, (ids_a, (ids_b, lengths), label, ts) in enumerate(_batches()):
        step(
            tf.constant(ids_a),
            tf.constant(ids_b),
            tf.constant(lengths),
            tf.constant(label),
            tf.constant(ts),
        )
        if (i + 1) % EVICT_EVERY == 0:
            ta.evict()
    return _state(ta, tb, w)


class _EvictAndExportHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, tables, w):
        self.tables, self.w, self.count, self.result = tables, w, 0, None

    def after_run(self, run_context, run_values):
        self.count += 1
        if self.count % EVICT_EVERY == 0:
            self.tables[0].evict(session=run_context.session)
        if self.count == STEPS:
            sess = run_context.session
            self.result = (*[t.export(session=sess) for t in self.tables], sess.run(self.w))


def _train_graph():
    with tf.Graph().as_default():
        ta, tb, w = _make()
        ph = [
            tf.compat.v1.placeholder(tf.int64, [None, 2]),
            tf.compat.v1.placeholder(tf.int64),
            tf.compat.v1.placeholder(tf.int64),
            tf.compat.v1.placeholder(tf.float32),
            tf.compat.v1.placeholder(tf.int64, [None]),
        ]
        ragged = tf.RaggedTensor.from_row_lengths(ph[1], ph[2])
        loss = _loss(ta, tb, w, ph[0], ragged, ph[3], ph[4])
        recs = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        grads = tf.gradients(loss, [w] + [r.embeddings for r in recs])
        train = tf.group(
            npu_rec.apply_recorded_gradients(recs, grads[1:]), w.assign_sub(0.1 * grads[0])
        )
        hook = _EvictAndExportHook([ta, tb], w)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            for ids_a, (ids_b, lengths), label, ts in _batches():
                sess.run(train, dict(zip(ph, [ids_a, ids_b, lengths, label, ts], strict=True)))
        return hook.result


def _assert_equal_states(x, y):
    for tx, ty in zip(x[:2], y[:2], strict=True):
        np.testing.assert_array_equal(tx["keys"], ty["keys"])
        np.testing.assert_allclose(tx["values"], ty["values"], atol=1e-6)
        for name in tx["slots"]:
            np.testing.assert_allclose(tx["slots"][name], ty["slots"][name], atol=1e-6)
        np.testing.assert_array_equal(tx["counts"], ty["counts"])
    np.testing.assert_allclose(x[2], y[2], atol=1e-6)


@pytest.fixture(scope="module")
def eager_state():
    return _train_eager(compiled=False)


def test_training_changed_the_model(eager_state):
    ta_state, tb_state, w = eager_state
    assert 0 < len(ta_state["keys"]) < 30  # admission and eviction both acted
    assert not np.allclose(w, np.linspace(-0.5, 0.5, 8)[:, None])


def test_tf_function_matches_eager(eager_state):
    _assert_equal_states(_train_eager(compiled=True), eager_state)


def test_v1_graph_under_monitored_session_matches_eager(eager_state):
    _assert_equal_states(_train_graph(), eager_state)


def test_v1_update_of_new_rows_waits_for_their_admission():
    """A loss linear in the embeddings: its gradient does not read the rows."""
    import numpy as np

    graph = tf.Graph()
    with graph.as_default():
        table = npu_rec.create_table("linear_v1", 2, optimizer=npu_rec.optimizers.SGD(1.0))
        ids = tf.constant([11, 12], tf.int64)
        emb = npu_rec.sparse_lookup(table, ids)
        loss = tf.reduce_sum(emb)  # d loss / d emb = 1 everywhere, whatever the rows hold
        recs = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        grads = tf.gradients(loss, [r.embeddings for r in recs])
        train_op = npu_rec.apply_recorded_gradients(recs, grads)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.tables_initializer())
            for _ in range(3):
                sess.run(train_op)
            exported = table.export(session=sess)
    order = np.argsort(exported["keys"])
    values = exported["values"][order]
    # Each step adds -1 to each row: three steps move every row by exactly -3 from its init.
    from tests.table.table_reference import keyed_uniform

    init = np.stack([keyed_uniform(k, 2, "linear_v1") for k in (11, 12)])
    np.testing.assert_allclose(values, init - 3.0, atol=1e-6)
