"""A table without an optimizer of its own follows the model's compiled Keras optimizer.

The swap a new user makes first: keras.io's collaborative-filtering example with
its `keras.layers.Embedding` layers replaced by `SparseEmbedding` (no `optimizer=`).
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding, TableNotTrainedError

USERS, ITEMS, DIM = 60, 40, 8


def _ratings(seed=0, n=4000):
    """Ratings in [0, 1] from hidden user and item factors (learnable, with noise)."""
    rng = np.random.default_rng(seed)
    u_f, i_f = rng.normal(size=(USERS, 3)), rng.normal(size=(ITEMS, 3))
    users, items = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    score = (u_f[users] * i_f[items]).sum(1) + rng.normal(scale=0.3, size=n)
    x = np.stack([users, items], 1).astype("int64")
    return x, (1 / (1 + np.exp(-score))).astype("float32")


def _recommender(embedding=SparseEmbedding, **emb_kwargs):
    """keras.io "Collaborative Filtering for Movie Recommendations", Embedding swapped."""
    npu_rec.table._registry.clear()
    keras.utils.set_random_seed(0)
    pair = keras.Input(shape=(2,), dtype="int64")
    he = dict(initializer=keras.initializers.RandomNormal(stddev=0.3, seed=0))
    user = embedding("user", DIM, **he, **emb_kwargs)(pair[:, 0])
    user_bias = embedding("user_bias", 1, **emb_kwargs)(pair[:, 0])
    item = embedding("item", DIM, **he, **emb_kwargs)(pair[:, 1])
    item_bias = embedding("item_bias", 1, **emb_kwargs)(pair[:, 1])
    dot = keras.ops.sum(user * item, axis=1, keepdims=True)
    return RecModel(pair, keras.layers.Activation("sigmoid")(dot + user_bias + item_bias))


@pytest.mark.parametrize("optimizer", ["adam", "adagrad", "sgd"])
def test_swapped_embedding_validation_loss_falls(optimizer, caplog):
    rate = {"adam": 0.01, "adagrad": 1.0, "sgd": 5.0}[optimizer]
    model = _recommender()
    with caplog.at_level(logging.INFO, logger="absl"):
        model.compile(
            optimizer=keras.optimizers.get({"class_name": optimizer, "config": {}}),
            loss="binary_crossentropy",
        )
        model.optimizer.learning_rate = rate
    x, y = _ratings()
    history = model.fit(x, y, batch_size=64, epochs=4, validation_split=0.2, verbose=0)
    val = history.history["val_loss"]
    assert val[-1] < val[0] - 0.01, val
    assert all(b < a for a, b in zip(val, val[1:], strict=False)), val
    # Logged once per table, naming the layer and the sparse counterpart.
    follows = [r.getMessage() for r in caplog.records if "follows the compiled" in r.getMessage()]
    assert len(follows) == 4 and "user_embedding" in follows[0], follows
    assert all(t.optimizer is not None for t in model.tables)


def test_counterpart_keeps_the_hyperparameters_and_follows_the_rate():
    model = _recommender()
    keras_adam = keras.optimizers.Adam(0.02, beta_1=0.8, beta_2=0.95, epsilon=1e-5)
    model.compile(optimizer=keras_adam, loss="mse")
    sparse = model.tables[0].optimizer
    assert isinstance(sparse, npu_rec.optimizers.Adam)
    assert (sparse.beta_1, sparse.beta_2, sparse.epsilon) == pytest.approx((0.8, 0.95, 1e-5))
    assert float(sparse.learning_rate_at(tf.constant(1, tf.int64))) == pytest.approx(0.02)
    # ReduceLROnPlateau / LearningRateScheduler change the Keras rate: the tables follow it.
    keras_adam.learning_rate = 0.005
    assert float(sparse.learning_rate_at(tf.constant(7, tf.int64))) == pytest.approx(0.005)

    model = _recommender()
    model.compile(optimizer=keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01), loss="mse")
    sparse = model.tables[0].optimizer
    assert isinstance(sparse, npu_rec.optimizers.Ftrl)
    assert (sparse.l1, sparse.l2, sparse.learning_rate_power) == pytest.approx((0.01, 0.0, -0.5))
    model = _recommender()
    model.compile(optimizer=keras.optimizers.AdamW(0.1), loss="mse")
    assert isinstance(model.tables[0].optimizer, npu_rec.optimizers.Adam)

    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    model = _recommender()
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    sparse = model.tables[0].optimizer
    for step in (1, 11, 21):  # the rate of update n is the schedule's at n - 1, as in Keras
        expected = float(schedule(step - 1))
        assert float(sparse.learning_rate_at(tf.constant(step, tf.int64))) == pytest.approx(
            expected
        )


def test_an_explicit_optimizer_is_kept():
    own = npu_rec.optimizers.Adagrad(0.3)
    model = _recommender(optimizer=own)
    model.compile(optimizer="adam", loss="mse")
    assert all(t.optimizer is own for t in model.tables)


@pytest.mark.parametrize(
    "optimizer", [keras.optimizers.RMSprop(), keras.optimizers.SGD(0.1, momentum=0.9)]
)
def test_no_counterpart_raises_at_compile_naming_the_layer(optimizer):
    model = _recommender()
    with pytest.raises(
        ValueError, match=r"SparseEmbedding 'user_embedding'.*no sparse counterpart"
    ):
        model.compile(optimizer=optimizer, loss="mse")


def test_a_frozen_table_is_asked_for_with_trainable_false():
    model = _recommender(trainable=False)
    model.compile(optimizer="rmsprop", loss="mse")  # nothing to follow: no error
    x, y = _ratings(n=256)
    before = [t.export()["values"].copy() for t in model.tables]
    model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    for table, old in zip(model.tables, before, strict=True):
        assert table.optimizer is None
        n = min(len(old), len(table.export()["values"]))
        np.testing.assert_array_equal(table.export()["values"][:n], old[:n])


def test_a_subclassed_model_follows_at_its_first_step():
    class Net(RecModel):
        def __init__(self):
            super().__init__()
            self.emb = SparseEmbedding("sub", DIM)
            self.out = keras.layers.Dense(1, activation="sigmoid")

        def call(self, x, training=None):
            return self.out(self.emb(x[:, 0], training=training))

    npu_rec.table._registry.clear()
    model = Net()
    model.compile(optimizer=keras.optimizers.Adagrad(0.5), loss="binary_crossentropy")
    x, y = _ratings(n=512)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    (table,) = model.tables
    assert isinstance(table.optimizer, npu_rec.optimizers.Adagrad)
    assert np.abs(table.export()["slots"]["accumulator"] - 0.1).max() > 0  # it trained

    npu_rec.table._registry.clear()
    model = Net()
    with pytest.raises(ValueError, match="SparseEmbedding 'sub_embedding'"):
        model.compile(optimizer="rmsprop", loss="mse")


def test_a_plain_keras_model_still_refuses_to_train_without_its_tables():
    model = _recommender()
    plain = keras.Model(model.inputs, model.outputs)
    plain.compile(optimizer="adam", loss="mse")
    x, y = _ratings(n=64)
    with pytest.raises(TableNotTrainedError, match="RecModel"):
        plain.fit(x, y, batch_size=32, epochs=1, verbose=0)


def test_a_saved_model_follows_its_compile_again_and_keeps_the_slots(tmp_path):
    model = _recommender()
    model.compile(optimizer=keras.optimizers.Adagrad(0.5), loss="binary_crossentropy")
    x, y = _ratings(n=512)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    npu_rec.table._registry.clear()
    loaded = keras.models.load_model(str(tmp_path / "m.keras"))
    for table, old in zip(loaded.tables, model.tables, strict=True):
        assert isinstance(table.optimizer, npu_rec.optimizers.Adagrad)
        got, want = table.read_state(0), old.read_state(0)
        for key in ("keys", "values", "slot/accumulator"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert loaded.layers[1].get_config()["optimizer"] is None  # not part of the config
