"""A non-finite loss stops a Keras run before it poisons weights, tables or checkpoints."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.keras import NanLossDuringTrainingError, RecModel, SparseEmbedding
from npu_rec.keras.callbacks import SparseCheckpoint
from tests.keras.builders import table_state

BATCH, BATCHES, BAD_BATCH = 8, 8, 4  # the 5th batch holds one inf


def _model(name="nan"):
    npu_rec.table._registry.clear()
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    num = keras.Input(shape=(2,), dtype="float32", name="num")
    emb = SparseEmbedding(name, 4, optimizer=npu_rec.optimizers.Adagrad(0.1))(ids)
    h = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([emb, num]))
    model = RecModel({"ids": ids, "num": num}, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def _dataset(bad=True):
    rng = np.random.default_rng(0)
    n = BATCH * BATCHES
    num = rng.normal(size=(n, 2)).astype("float32")
    if bad:
        num[BAD_BATCH * BATCH + 3, 1] = np.inf
    x = {"ids": rng.integers(0, 40, n).astype("int64"), "num": num}
    return tf.data.Dataset.from_tensor_slices((x, (rng.random(n) < 0.5).astype("float32"))).batch(
        BATCH
    )


def _finite(model):
    return all(np.isfinite(w).all() for w in model.get_weights()) and all(
        np.isfinite(v).all() for v in table_state(model.tables[0]).values()
    )


def test_one_inf_stops_fit_before_any_update_or_checkpoint(tmp_path):
    model = _model()
    ckpt = SparseCheckpoint(str(tmp_path / "ckpt"), save_freq=1)
    keras_ckpt = keras.callbacks.ModelCheckpoint(str(tmp_path / "m-{batch}.keras"), save_freq=1)
    backup = keras.callbacks.BackupAndRestore(
        str(tmp_path / "backup"), save_freq=1, delete_checkpoint=False
    )
    with pytest.raises(NanLossDuringTrainingError, match=r"training step 5 is not finite"):
        model.fit(_dataset(), epochs=1, verbose=0, callbacks=[ckpt, keras_ckpt, backup])
    # The Estimator's error class: one `except` catches both front ends.
    assert issubclass(NanLossDuringTrainingError, tf.compat.v1.train.NanLossDuringTrainingError)

    # The failing step changed nothing: the model holds the state after step 4.
    assert model.global_step == BAD_BATCH
    assert int(model.optimizer.iterations) == BAD_BATCH
    assert _finite(model)
    # No checkpoint of the failing step: every one written holds a finite state.
    assert [s for s, _ in ckpt.saves] == [1, 2, 3, 4]
    saved = sorted(glob.glob(str(tmp_path / "m-*.keras")))
    assert [os.path.basename(p) for p in saved] == [f"m-{i}.keras" for i in range(1, 5)]
    npu_rec.table._registry.clear()
    restored = keras.models.load_model(saved[-1])
    assert restored.global_step == BAD_BATCH
    assert _finite(restored)
    dense = np.load(str(tmp_path / "ckpt" / f"dense-{BAD_BATCH:012d}.npz"))
    assert all(np.isfinite(dense[k]).all() for k in dense.files)


def test_a_clean_run_is_not_stopped():
    model = _model()
    history = model.fit(_dataset(bad=False), epochs=2, verbose=0)
    assert model.global_step == int(model.optimizer.iterations) == 2 * BATCHES
    assert np.isfinite(history.history["loss"]).all()


def test_non_finite_dense_state_is_never_saved(tmp_path):
    model = _model()
    ckpt = SparseCheckpoint(str(tmp_path / "ckpt"), save_freq=4)
    model.fit(_dataset(bad=False), epochs=1, verbose=0, callbacks=[ckpt])
    before = sorted(os.listdir(tmp_path / "ckpt"))
    kernel = model.layers[-1].kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    message = r"refused: weight .*kernel.* non-finite"
    with pytest.raises(ValueError, match="model.save " + message):
        model.save(str(tmp_path / "m.keras"))
    with pytest.raises(ValueError, match="model.save_weights " + message):
        model.save_weights(str(tmp_path / "m.weights.h5"))
    with pytest.raises(ValueError, match="SparseCheckpoint " + message):
        ckpt.save()
    assert not os.path.exists(tmp_path / "m.keras")
    assert not os.path.exists(tmp_path / "m.weights.h5")
    assert sorted(os.listdir(tmp_path / "ckpt")) == before


def test_train_on_batch_and_online_train_stop_too():
    model = _model()
    batches = list(_dataset())
    for x, y in batches[:BAD_BATCH]:
        model.train_on_batch(x, y)
    weights = [w.copy() for w in model.get_weights()]
    with pytest.raises(NanLossDuringTrainingError, match=f"step {BAD_BATCH + 1}"):
        model.train_on_batch(*batches[BAD_BATCH])
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)

    online = _model("nan_online")
    with pytest.raises(NanLossDuringTrainingError):
        online.online_train(_dataset(), dataset_sink_mode=True, sink_size=3)
    assert online.global_step == BAD_BATCH  # the sink of steps 4-6 stopped at step 5
    assert _finite(online)


class _Ends(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train_end, self.batches = 0, []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(float(logs["loss"]))

    def on_train_end(self, logs=None):
        self.train_end += 1


def test_terminate_on_nan_stops_gracefully_without_a_non_finite_save(tmp_path):
    """Keras' TerminateOnNaN: `stop_training`, `on_train_end` runs, `fit` returns."""
    model = _model()
    ends = _Ends()
    ckpt = SparseCheckpoint(str(tmp_path / "ckpt"), save_freq=1)
    keras_ckpt = keras.callbacks.ModelCheckpoint(str(tmp_path / "m-{batch}.keras"), save_freq=1)
    history = model.fit(
        _dataset(),
        epochs=3,
        verbose=0,
        callbacks=[keras.callbacks.TerminateOnNaN(), ckpt, keras_ckpt, ends],
    )
    assert model.stop_training
    assert ends.train_end == 1  # on_train_end ran once
    assert len(ends.batches) == BAD_BATCH + 1 and np.isnan(ends.batches[-1])
    assert len(history.history["loss"]) == 1  # the first epoch was the last
    # The failing step updated nothing; every table, weight and checkpoint is finite.
    assert model.global_step == int(model.optimizer.iterations) == BAD_BATCH
    assert _finite(model)
    for path in glob.glob(str(tmp_path / "m-*.keras")):
        npu_rec.table._registry.clear()
        assert _finite(keras.models.load_model(path)), path
    assert ckpt.saves and max(s for s, _ in ckpt.saves) == BAD_BATCH
    for path in glob.glob(str(tmp_path / "ckpt" / "dense-*.npz")):
        dense = np.load(path)
        assert all(np.isfinite(dense[k]).all() for k in dense.files), path
    restored = _model()
    reader = SparseCheckpoint(str(tmp_path / "ckpt"), restore=True)
    reader.set_model(restored)
    assert reader.restore_version() == BAD_BATCH  # the newest table checkpoint: finite
    assert restored.tables[0].size() > 0 and _finite(restored)

    # Without TerminateOnNaN the same run raises, as before.
    with pytest.raises(NanLossDuringTrainingError):
        _model("nan_raise").fit(_dataset(), epochs=1, verbose=0)
