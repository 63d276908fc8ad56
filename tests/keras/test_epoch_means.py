"""Epoch means of `fit` and `evaluate` over datasets that end without a known length.

A dataset with a static batch size and an unknown number of batches (a generator,
`as_dataset(use_dynamic=False)`) ends when Keras' next `get_next` fails inside the
step function. Ops of the step that do not depend on the batch (a metric's sample
count of a static batch size) could still run then, counting a batch that never
came: the reported epoch loss and accuracy were too low by 1/(batches + 1).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding
from npu_rec.table import _registry as _table_registry

BATCHES, BATCH = 4, 8


@pytest.fixture(autouse=True)
def _fresh_tables():
    _table_registry.clear()
    yield
    _table_registry.clear()


def _data(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, size=(BATCHES * BATCH,)).astype(np.int64)
    dense = rng.normal(size=(BATCHES * BATCH, 3)).astype(np.float32)
    label = rng.integers(0, 2, size=(BATCHES * BATCH, 1)).astype(np.float32)
    return ids, dense, label


def _dataset(ids, dense, label):
    def gen():
        for b in range(BATCHES):
            s = slice(b * BATCH, (b + 1) * BATCH)
            yield {"id": ids[s], "num": dense[s]}, label[s]

    return tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            {"id": tf.TensorSpec([BATCH], tf.int64), "num": tf.TensorSpec([BATCH, 3], tf.float32)},
            tf.TensorSpec([BATCH, 1], tf.float32),
        ),
    )


def _model():
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(), dtype="int64", name="id")
    num = keras.Input(shape=(3,), name="num")
    emb = SparseEmbedding("t", 4, optimizer=npu_rec.optimizers.SGD(0.1))(ids)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([emb, num]))
    model = RecModel({"id": ids, "num": num}, out)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["binary_accuracy"]
    )
    return model


class _BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(dict(logs))


def test_fit_epoch_log_is_the_mean_over_the_batches_that_came():
    data = _data(0)
    model = _model()
    batch_logs = _BatchLogs()
    history = model.fit(_dataset(*data), epochs=1, verbose=0, callbacks=[batch_logs])
    assert len(batch_logs.logs) == BATCHES
    # Batch logs are the running means of the epoch; the epoch's is the last batch's.
    for name in ("loss", "binary_accuracy"):
        np.testing.assert_allclose(history.history[name][0], batch_logs.logs[-1][name], rtol=1e-6)


def test_evaluate_is_the_mean_over_the_batches_that_came():
    ids, dense, label = _data(1)
    model = _model()
    model.fit(_dataset(ids, dense, label), epochs=1, verbose=0)
    got = model.evaluate(_dataset(ids, dense, label), verbose=0, return_dict=True)
    pred = model.predict({"id": ids, "num": dense}, batch_size=BATCH, verbose=0)
    p = np.clip(pred.astype(np.float64), 1e-7, 1 - 1e-7)
    bce = -(label * np.log(p) + (1 - label) * np.log(1 - p))
    np.testing.assert_allclose(got["loss"], bce.mean(), rtol=1e-4)
    np.testing.assert_allclose(got["binary_accuracy"], ((pred > 0.5) == label).mean(), rtol=1e-6)
