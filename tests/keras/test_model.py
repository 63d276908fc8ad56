"""RecModel: DeepFM acceptance, the wrapper form, row-local updates, amp levels, errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding
from tests.keras.builders import (
    CATEGORICAL,
    criteo,
    deepfm_network,
    deepfm_recmodel,
    table_state,
)


def test_deepfm_fit_auc_table_growth_and_row_local_updates():
    x, y = criteo(0, 16384)
    xv, yv = criteo(16384, 20480)
    model = deepfm_recmodel()
    first = {k: v[:8192] for k, v in x.items()}
    model.fit(first, y[:8192], batch_size=256, epochs=1, verbose=0, shuffle=False)
    sizes_before = [int(t.size()) for t in model.tables]
    history = model.fit(
        x,
        y,
        batch_size=256,
        epochs=3,
        initial_epoch=1,
        verbose=0,
        shuffle=False,
        validation_data=(xv, yv),
    )
    sizes_after = [int(t.size()) for t in model.tables]

    # Keras-style history with the AUC metric, validation and initial_epoch.
    assert set(history.history) >= {"loss", "auc", "val_loss", "val_auc"}
    assert history.epoch == [1, 2]
    assert history.history["val_auc"][-1] > 0.65
    # Tables grow as new ids arrive (never shrink without eviction).
    assert all(a >= b for a, b in zip(sizes_after, sizes_before, strict=True))
    assert sum(sizes_after) > sum(sizes_before)
    assert model.global_step == 32 + 2 * 64

    # One step changes exactly the rows of ids in its batch.
    batch = {k: v[:256] for k, v in xv.items()}
    assert all(t.name.split("_")[0] in batch for t in model.tables)
    before = [table_state(t) for t in model.tables]
    # fit on one batch of the traced shape reuses the traced step (a retrace costs ~1 s
    # per table; train_on_batch or another batch size would retrace).
    model.fit(batch, yv[:256], batch_size=256, epochs=1, verbose=0)
    assert model.global_step == 32 + 2 * 64 + 1
    for table, old in zip(model.tables, before, strict=True):
        new = table_state(table)
        in_batch = set(batch[table.name.split("_")[0]].tolist())
        changed = {k for k in old if not np.array_equal(old[k], new[k])}
        assert changed <= in_batch
        assert changed == in_batch & set(old)  # every old row looked up moved
        assert set(new) - set(old) <= in_batch


def test_wrapper_form_trains_to_the_same_result():
    features = CATEGORICAL[:3]  # the same DeepFM on fewer features: a cheaper trace
    x, y = criteo(0, 2048, categorical=features)
    xv, _ = criteo(4096, 4608, categorical=features)
    functional = deepfm_recmodel(categorical=features)
    functional.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)
    expected = functional.predict(xv, verbose=0)
    assert len(functional.tables) == 2 * len(features)

    npu_rec.table._registry.clear()
    keras.utils.set_random_seed(0)
    wrapped = RecModel(
        network=deepfm_network(categorical=features),
        loss_fn=keras.losses.BinaryCrossentropy(),
        optimizer=keras.optimizers.Adam(),
        metrics={"auc"},
    )
    history = wrapped.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)
    assert "auc" in history.history
    np.testing.assert_allclose(wrapped.predict(xv, verbose=0), expected, rtol=1e-5, atol=1e-6)


def _tiny(name, amp_level="O0", lr=0.5, norm=False):
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    emb = SparseEmbedding(name, 4, optimizer=npu_rec.optimizers.SGD(lr))(ids)
    h = keras.layers.Dense(8, kernel_initializer=keras.initializers.GlorotUniform(seed=1))(emb)
    if norm:
        h = keras.layers.BatchNormalization()(h)
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(h)
    return RecModel(ids, out, amp_level=amp_level)


def test_amp_o2_mixed_float16_with_loss_scaling_unscales_table_gradients():
    ids = np.array([1, 2, 3, 4])
    y = np.ones((4, 1), "float32")
    deltas = {}
    for level in ("O0", "O2"):
        model = _tiny(f"amp{level}", level)
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        model(ids)  # admit rows without training
        model.train_on_batch(ids, y)  # first step admits and initialises the rows
        before = table_state(model.tables[0])
        model.train_on_batch(ids, y)
        after = table_state(model.tables[0])
        deltas[level] = np.stack([after[k] - before[k] for k in sorted(before)])
        if level == "O2":
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            assert model.layers[2].dtype_policy.name == "mixed_float16"
            assert model.layers[3].dtype_policy.name == "float32"  # BatchNorm stays float32
            assert model.layers[-1].dtype_policy.name == "float32"  # the output layer too
    assert np.abs(deltas["O0"]).max() > 0
    np.testing.assert_allclose(deltas["O2"], deltas["O0"], rtol=0.05, atol=1e-4)


def test_amp_o2_policies():
    model = _tiny("o2", "O2", norm=True)
    model.compile(optimizer="sgd", loss="mse")
    assert model.layers[1].dtype_policy.name == "float32"  # the table layer
    assert model.layers[2].dtype_policy.name == "mixed_float16"
    assert model.layers[3].dtype_policy.name == "float32"  # BatchNorm stays float32
    assert model.layers[-1].dtype_policy.name == "float32"  # so does the output layer


def test_amp_o3_casts_everything_without_loss_scaling():
    model = _tiny("o3", "O3", norm=True)
    model.compile(optimizer="sgd", loss="mse")
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.layers[2].dtype_policy.name == "mixed_float16"
    assert model.layers[3].dtype_policy.name == "mixed_float16"
    model.fit(np.arange(8), np.ones(8), epochs=1, verbose=0)
    assert np.isfinite(model.predict(np.arange(8), verbose=0)).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(amp_level="O1"), "`amp_level` must be one of"),
        (dict(boost_level="O3"), "`boost_level` must be one of"),
    ],
)
def test_level_errors(kwargs, message):
    ids = keras.Input(shape=(), dtype="int64")
    out = keras.layers.Dense(1)(SparseEmbedding("lvl", 2)(ids))
    with pytest.raises(ValueError, match=message):
        RecModel(ids, out, **kwargs)


def test_jit_compile_is_refused_and_off_by_default():
    model = _tiny("xla")
    with pytest.raises(ValueError, match="jit_compile"):
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    model.compile(optimizer="sgd", loss="mse")
    assert model.jit_compile is False


def test_wrapper_eval_network_with_eval_indexes():
    net = _tiny("ev")

    class EvalNet(keras.layers.Layer):
        def call(self, x, y, training=None):
            pred = net(x, training=False)
            loss = tf.reduce_mean(tf.square(pred - tf.cast(y, pred.dtype)))
            return loss, tf.sigmoid(pred), y

    model = RecModel(
        network=net,
        loss_fn="mse",
        optimizer="sgd",
        metrics=["auc"],
        eval_network=EvalNet(),
        eval_indexes=[0, 1, 2],
    )
    x, y = np.arange(16), (np.arange(16) % 2).astype("float32")[:, None]
    model.fit(x, y, epochs=1, verbose=0)
    result = model.evaluate(x, y, verbose=0, return_dict=True)
    assert set(result) >= {"loss", "auc"}


def test_wrapper_without_loss_fn_uses_the_network_loss():
    ids = keras.Input(shape=(), dtype="int64")
    y = keras.Input(shape=(), dtype="float32")
    pred = keras.layers.Dense(1)(
        SparseEmbedding("nl", 2, optimizer=npu_rec.optimizers.SGD(0.5))(ids)
    )
    loss = keras.ops.mean(keras.ops.square(keras.ops.squeeze(pred, -1) - y))
    net = keras.Model([ids, y], loss)
    model = RecModel(network=net, optimizer=keras.optimizers.SGD(0.1))
    data = tf.data.Dataset.from_tensor_slices((np.arange(32), np.ones(32, "float32"))).batch(8)
    history = model.fit(data, epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_wrapper_arguments_need_network():
    ids = keras.Input(shape=(), dtype="int64")
    out = keras.layers.Dense(1)(SparseEmbedding("wn", 2)(ids))
    with pytest.raises(ValueError, match="need `network`"):
        RecModel(ids, out, loss_fn="mse")
