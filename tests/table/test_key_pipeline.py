"""The key pipeline: ids deduplicated in tf.data train exactly like plain ids."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
import npu_rec.data
from npu_rec.keras import RecModel, SparseEmbedding
from npu_rec.table import _registry as _table_registry

RNG = np.random.default_rng(7)
USER = RNG.integers(0, 40, size=(64, 3)).astype(np.int64)
ITEM_LENGTHS = RNG.integers(0, 4, size=64)
ITEM = tf.RaggedTensor.from_row_lengths(
    RNG.integers(-20, 20, size=int(ITEM_LENGTHS.sum())).astype(np.int64), ITEM_LENGTHS
)
TS = np.arange(64, dtype=np.int64) + 100
LABELS = RNG.random(64).astype(np.float32)


def _dataset(prepare: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices(({"user": USER, "item": ITEM, "ts": TS}, LABELS))
    ds = ds.batch(16)
    if prepare:
        ds = npu_rec.prepare_keys(ds, ["user", "item"])
    return ds.prefetch(2)


def _tables(access=1):
    kw = dict(
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=access,
        eviction_threshold=50,
        dynamic_expansion=True,
        capacity=4,
    )
    return npu_rec.create_table("user", 4, **kw), npu_rec.create_table(
        "item", 4, num_shards=2, **kw
    )


def _core_train(prepare: bool, in_function: bool):
    _table_registry.clear()
    user, item = _tables()

    def step(feats, labels):
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            u = npu_rec.sparse_lookup(user, feats["user"], combiner="mean", timestamps=feats["ts"])
            i = npu_rec.sparse_lookup(item, feats["item"], combiner="sum", timestamps=feats["ts"])
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(u * i, 1) - labels))
        npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
        infer = npu_rec.sparse_lookup(user, feats["user"], is_training=False)
        return loss, infer

    fn = tf.function(step) if in_function else step
    out = [fn(f, y) for f, y in _dataset(prepare)]
    return user.export(), item.export(), out


@pytest.mark.parametrize("in_function", [False, True])
def test_prepared_ids_train_like_plain_ids(in_function):
    plain = _core_train(False, in_function)
    prepared = _core_train(True, in_function)
    for a, b in zip(plain[:2], prepared[:2], strict=True):
        np.testing.assert_array_equal(a["keys"], b["keys"])
        np.testing.assert_array_equal(a["counts"], b["counts"])
        np.testing.assert_array_equal(a["last_seen"], b["last_seen"])
        np.testing.assert_allclose(a["values"], b["values"], atol=1e-6)
    for (la, ia), (lb, ib) in zip(plain[2], prepared[2], strict=True):
        np.testing.assert_allclose(la.numpy(), lb.numpy(), atol=1e-6)
        np.testing.assert_allclose(ia.numpy(), ib.numpy(), atol=1e-6)


def test_prepare_ids_and_apply_gradients():
    _table_registry.clear()
    table = npu_rec.create_table("t", 2, optimizer=npu_rec.optimizers.SGD(1.0))
    ids = tf.constant([[5, 3], [5, 9]], tf.int64)
    prepared = npu_rec.prepare_ids(ids)
    np.testing.assert_array_equal(prepared.unique.numpy(), [5, 3, 9])
    np.testing.assert_array_equal(prepared.counts.numpy(), [2, 1, 1])
    before = npu_rec.sparse_lookup(table, prepared)
    assert before.shape == (2, 2, 2)
    table.apply_gradients(prepared, tf.ones([2, 2, 2]))
    after = npu_rec.sparse_lookup(table, ids, is_training=False)
    np.testing.assert_allclose(
        after.numpy(), before.numpy() - [[[2, 2], [1, 1]], [[2, 2], [1, 1]]], atol=1e-6
    )


def test_prepare_keys_errors():
    ds = tf.data.Dataset.from_tensor_slices({"a": [[1]]})
    with pytest.raises(ValueError, match=r"features \['b'\] are not in the dataset"):
        npu_rec.data.prepare_keys(ds, ["b"])
    with pytest.raises(ValueError, match="needs dataset elements that are a dict"):
        npu_rec.prepare_keys(tf.data.Dataset.from_tensor_slices([[1]]), ["a"])


class PipelineNet(RecModel):
    def __init__(self):
        super().__init__()
        kw = dict(
            optimizer=npu_rec.optimizers.Adagrad(0.1),
            access_threshold=1,
            eviction_threshold=50,
            dynamic_expansion=True,
        )
        self.user = SparseEmbedding("user", 4, combiner="mean", **kw)
        self.item = SparseEmbedding("item", 4, combiner="sum", **kw)
        self.out = keras.layers.Dense(1, kernel_initializer="ones")

    def call(self, feats, training=None):
        u = self.user(feats["user"], timestamps=feats["ts"], training=training)
        i = self.item(feats["item"], timestamps=feats["ts"], training=training)
        return self.out(tf.concat([tf.reshape(u, [-1, 4]), tf.reshape(i, [-1, 4])], 1))


def _keras_fit(prepare: bool):
    _table_registry.clear()
    keras.utils.set_random_seed(0)
    model = PipelineNet()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(_dataset(prepare), epochs=2, verbose=0)
    return [t.export() for t in model.tables], history.history["loss"]


def test_keras_fit_with_prepared_keys_matches_plain():
    plain_tables, plain_loss = _keras_fit(False)
    prep_tables, prep_loss = _keras_fit(True)
    np.testing.assert_allclose(plain_loss, prep_loss, rtol=1e-6)
    for a, b in zip(plain_tables, prep_tables, strict=True):
        np.testing.assert_array_equal(a["keys"], b["keys"])
        np.testing.assert_allclose(a["values"], b["values"], atol=1e-6)
