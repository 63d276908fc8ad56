"""Standard Keras callbacks on a RecModel: BackupAndRestore, EarlyStopping, get/set_weights."""

import keras
import numpy as np
import pytest

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding

STEPS = 4  # batches per epoch


def _model(lr=0.1):
    npu_rec.table._registry.clear()
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    emb = SparseEmbedding("cb_item", 4, optimizer=npu_rec.optimizers.Adagrad(lr))(ids)
    out = keras.layers.Dense(1, activation="sigmoid")(emb)
    model = RecModel(ids, out)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def _data(seed=0, n=8 * STEPS):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30, n).astype("int64")
    return ids, (ids % 3 == 0).astype("float32")


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


class _StepAtBegin(keras.callbacks.Callback):
    step = None

    def on_train_begin(self, logs=None):
        self.step = self.model.global_step


def test_backup_and_restore_resumes_the_global_step(tmp_path):
    x, y = _data()
    backup = str(tmp_path / "backup")
    model = _model()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=3,
            verbose=0,
            shuffle=False,
            callbacks=[keras.callbacks.BackupAndRestore(backup), _Interrupt(2, 1)],
        )
    assert model.global_step == 2 * STEPS + 2

    resumed = _model()
    begin = _StepAtBegin()
    history = resumed.fit(
        x,
        y,
        batch_size=8,
        epochs=3,
        verbose=0,
        shuffle=False,
        callbacks=[keras.callbacks.BackupAndRestore(backup), begin],
    )
    assert history.epoch == [2]
    # The backup of the end of epoch 2 holds its global step: step-based saves,
    # evictions and the precision switch continue where the run stopped.
    assert begin.step == 2 * STEPS
    assert resumed.global_step == 3 * STEPS


class _Scores(keras.callbacks.Callback):
    """Puts a chosen `score` in the epoch logs and records the model at each epoch end."""

    def __init__(self, scores):
        super().__init__()
        self.scores, self.dense, self.tables = scores, [], []

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]
        self.dense.append([w.copy() for w in self.model.get_weights()])
        self.tables.append(self.model.tables[0].read_state(0))


def _assert_same_tables(state, expected):
    assert sorted(state) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(state[key], expected[key], err_msg=key)


def test_early_stopping_restores_tables_with_the_best_dense_weights():
    x, y = _data()
    model = _model()
    scores = _Scores([3.0, 1.0, 2.0, 4.0, 5.0, 6.0])
    stop = keras.callbacks.EarlyStopping(
        monitor="score", mode="min", patience=2, restore_best_weights=True
    )
    history = model.fit(
        x, y, batch_size=8, epochs=6, verbose=0, shuffle=False, callbacks=[scores, stop]
    )
    assert history.epoch == [0, 1, 2, 3] and stop.best_epoch == 1
    # The last epoch changed the tables: restoring them is observable.
    assert not np.array_equal(scores.tables[3]["values"], scores.tables[1]["values"])
    for got, want in zip(model.get_weights(), scores.dense[1], strict=True):
        np.testing.assert_array_equal(got, want)
    _assert_same_tables(model.tables[0].read_state(0), scores.tables[1])
    assert model.global_step == 4 * STEPS  # training time is not rolled back


def test_get_and_set_weights_carry_the_tables():
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    table = model.tables[0]
    weights = model.get_weights()
    assert len(weights) == len(model.weights)
    before = table.read_state(0)
    model.fit(*_data(seed=1, n=64), batch_size=8, epochs=1, verbose=0)
    assert int(table.size()) > before["keys"].size
    _assert_same_tables(weights.tables[table.name], before)  # a copy, not a view

    model.set_weights(weights)
    _assert_same_tables(table.read_state(0), before)

    # A plain list of arrays sets the dense weights only (Keras' contract).
    model.fit(*_data(seed=2), batch_size=8, epochs=1, verbose=0)
    moved = table.read_state(0)
    model.set_weights([w.copy() for w in weights])
    _assert_same_tables(table.read_state(0), moved)
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)


def test_set_weights_refuses_a_snapshot_without_this_models_tables():
    model = _model()
    model.fit(*_data(), batch_size=8, epochs=1, verbose=0)
    weights = model.get_weights()
    weights.tables = {"other": weights.tables["cb_item"]}
    dense = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=r"no snapshot of tables \['cb_item'\].*\['other'\]"):
        model.set_weights(weights)
    for got, want in zip(model.get_weights(), dense, strict=True):
        np.testing.assert_array_equal(got, want)


class _RollBack(keras.callbacks.Callback):
    """Snapshots the model at the end of epoch 0 and sets it back at the end of epoch 1."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.snapshot = self.model.get_weights()
        elif epoch == 1:
            self.model.set_weights(self.snapshot)


def test_tables_set_by_set_weights_reach_the_next_delta_checkpoint(tmp_path):
    from npu_rec.keras.callbacks import SparseCheckpoint

    npu_rec.init(
        max_steps=3 * STEPS,
        save_steps=-1,
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=1000,
        save_delta_checkpoints_secs=2,
    )
    model = _model()
    ckpt = SparseCheckpoint(str(tmp_path / "ckpt"), clock=lambda: float(model.global_step))
    # Epoch 1 trains other ids than epoch 0, so the rollback removes keys.
    x = np.concatenate([_data(0)[0], _data(1)[0] + 100, _data(2)[0]])
    model.fit(
        x,
        (x % 3 == 0).astype("float32"),
        batch_size=8,
        epochs=3,
        verbose=0,
        shuffle=False,
        callbacks=[_RollBack(), ckpt],
        steps_per_epoch=STEPS,
    )
    assert ckpt.saves[-1] == (3 * STEPS, "delta")  # the newest version is a delta
    expected = model.tables[0].read_state(0)

    fresh = _model()
    fresh.build(None)
    restored = SparseCheckpoint(str(tmp_path / "ckpt"), restore=True)
    restored.set_model(fresh)
    assert restored.restore_version() == 3 * STEPS
    got = fresh.tables[0].read_state(0)
    for key in ("keys", "values", "counts", "last_seen", "slot/accumulator"):
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
