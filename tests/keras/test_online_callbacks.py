"""online_train, SparseCheckpoint resume, Evict, admission, AccelerateTrain, StepConsistency."""

import os

import keras
import numpy as np
import pytest

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding
from npu_rec.keras.callbacks import AccelerateTrain, Evict, SparseCheckpoint, StepConsistency
from tests.keras.builders import table_state


def small_model(access_threshold=-1, eviction_threshold=-1, timestamps=False):
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    inputs = {"ids": ids}
    kwargs = {}
    if timestamps:
        inputs["ts"] = kwargs["timestamps"] = keras.Input(shape=(), dtype="int64", name="ts")
    emb = SparseEmbedding(
        "item",
        4,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=access_threshold,
        eviction_threshold=eviction_threshold,
    )(ids, **kwargs)
    out = keras.layers.Dense(
        1, activation="sigmoid", kernel_initializer=keras.initializers.GlorotUniform(seed=0)
    )(emb)
    model = RecModel(inputs, out)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def stream(seed=0, batch=32):
    """An infinite generator of (x, y) batches of raw ids."""
    rng = np.random.default_rng(seed)
    while True:
        ids = rng.integers(0, 200, batch).astype("int64") * 7919 + 10**12
        yield {"ids": ids}, (ids % 3 == 0).astype("float32")


class CountCalls(keras.callbacks.Callback):
    def __init__(self, stop_at=None):
        super().__init__()
        self.calls, self.stop_at = 0, stop_at

    def on_train_batch_end(self, batch, logs=None):
        self.calls += 1
        if self.stop_at is not None and self.model.global_step >= self.stop_at:
            self.model.stop_training = True


def test_online_train_stops_at_max_steps_saves_full_and_delta_and_resumes(tmp_path):
    directory = str(tmp_path / "ckpt")
    npu_rec.init(
        max_steps=12,
        save_steps=6,
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=1000,
        save_delta_checkpoints_secs=2,
    )
    model = small_model()
    ckpt = SparseCheckpoint(directory, clock=lambda: float(model.global_step))
    model.online_train(stream(), callbacks=[ckpt], dataset_sink_mode=False)
    assert model.global_step == 12
    # The first timed save has no base, so it is full; then deltas between step saves.
    assert ckpt.saves == [
        (2, "full"),
        (4, "delta"),
        (6, "full"),
        (8, "delta"),
        (10, "delta"),
        (12, "full"),
    ]
    kinds = {v.kind for v in ckpt.manager().versions()}
    assert kinds == {"full", "delta"}
    saved_tables = table_state(model.tables[0])
    saved_dense = [w.numpy() for w in model.weights]

    # A restarted program: a fresh model with the same table names resumes at step 12.
    npu_rec.shutdown()
    npu_rec.table._registry.clear()
    npu_rec.init(max_steps=20, if_load=True, save_steps=6)
    resumed = small_model()
    ckpt2 = SparseCheckpoint(directory)
    assert ckpt2.prepare(resumed) == 12
    assert resumed.global_step == 12
    restored = table_state(resumed.tables[0])
    assert restored.keys() == saved_tables.keys()
    for key, row in saved_tables.items():
        np.testing.assert_array_equal(restored[key], row)
    for w, value in zip(resumed.weights, saved_dense, strict=True):
        np.testing.assert_array_equal(w.numpy(), value)
    resumed.online_train(stream(seed=1), callbacks=[ckpt2], dataset_sink_mode=False)
    assert resumed.global_step == 20
    assert ckpt2.saves[-1] == (20, "full")

    # restore_model_version picks the full save at or before it plus the deltas.
    npu_rec.table._registry.clear()
    npu_rec.init(if_load=True, restore_model_version=8)
    again = small_model()
    assert SparseCheckpoint(directory).prepare(again) == 8


@pytest.mark.parametrize(
    "sink_mode, sink_size, calls", [(True, 4, 3), (False, 4, 12), (True, 1, 12)]
)
def test_sink_mode_runs_sink_size_steps_per_call(sink_mode, sink_size, calls):
    npu_rec.init(max_steps=12)
    model = small_model()
    counter = CountCalls()
    model.online_train(
        stream(), callbacks=counter, dataset_sink_mode=sink_mode, sink_size=sink_size
    )
    assert model.global_step == 12
    assert counter.calls == calls


def test_online_train_until_a_callback_stops_it():
    model = small_model()
    model.online_train(stream(), callbacks=[CountCalls(stop_at=5)], dataset_sink_mode=False)
    assert model.global_step == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sink_size=0), "`sink_size` must be an integer >= 1"),
        (dict(dataset_sink_mode="yes"), "`dataset_sink_mode` must be True or False"),
    ],
)
def test_online_train_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_model().online_train(stream(), **kwargs)


def test_admission_ids_below_threshold_read_zeros_and_get_no_rows():
    model = small_model(access_threshold=3)
    frequent, rare = 10**12 + 5, 10**12 + 7
    for _ in range(3):
        model.train_on_batch(
            {"ids": np.array([frequent, frequent, rare][: 2 + (_ == 0)])},
            np.ones(2 + (_ == 0), "float32"),
        )
    keys = set(table_state(model.tables[0]))
    assert frequent in keys and rare not in keys
    layer = model.get_layer("item_embedding")
    np.testing.assert_array_equal(layer(np.array([rare]), training=False), np.zeros((1, 4)))
    assert np.abs(layer(np.array([frequent]), training=False).numpy()).sum() > 0


def test_evict_callback_frees_rows_of_idle_ids():
    model = small_model(access_threshold=0, eviction_threshold=10, timestamps=True)
    evict = Evict(evict_time_interval=None, evict_step_interval=2)
    x = {"ids": np.array([1, 2, 3, 4, 5, 6]), "ts": np.array([100, 100, 100, 100, 200, 200])}
    model.fit(
        x,
        np.ones(6, "float32"),
        batch_size=2,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[evict],
    )
    # Steps 1-2 see ids 1-4 at t=100, step 3 sees 5, 6 at t=200; eviction runs after step 2
    # (nothing idle yet) and at the end of training only through the step cadence.
    assert evict.evictions == [(2, {"item": 0})]
    evict.evict()
    assert evict.evictions[-1][1] == {"item": 4}
    assert set(table_state(model.tables[0])) == {5, 6}


def test_online_train_adds_a_default_evict_for_tables_with_eviction():
    npu_rec.init(max_steps=3)
    model = small_model(access_threshold=0, eviction_threshold=60)
    callbacks = []
    model.online_train(stream(), callbacks=callbacks, dataset_sink_mode=False)
    assert model.global_step == 3


@pytest.mark.parametrize(
    "mode, low", [("fast1|step|0.5", "bfloat16"), ("fast|step|0.5", "float16")]
)
def test_accelerate_train_switches_once_to_full_precision(mode, low):
    model = small_model()
    accel = AccelerateTrain(mode)
    x = {"ids": np.arange(64, dtype="int64")}
    model.fit(x, np.ones(64, "float32"), batch_size=8, epochs=1, verbose=0, callbacks=[accel])
    assert accel.precision_log == [(s, low if s < 4 else "float32") for s in range(8)]
    assert accel.low_precision_steps == [1, 1, 1, 1, 0, 0, 0, 0]
    assert accel.switch.switched_at == 4
    assert model.get_layer(index=-1).dtype_policy.name == "float32"
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == (low == "float16")
    assert int(model.tables[0].size()) == 64  # the tables kept every row across the switch


def test_step_consistency_checks_init_against_fit():
    npu_rec.init(max_steps=10)
    model = small_model()
    x, y = {"ids": np.arange(40, dtype="int64")}, np.ones(40, "float32")
    with pytest.raises(npu_rec.ConfigError, match="max_steps=10"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # RecModel adds the check
    check = StepConsistency()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[check])
    assert check.resolved.max_steps == 10


def test_sparse_checkpoint_saves_and_restores_the_data_position(tmp_path):
    class Source:
        def __init__(self):
            self.position = 0

        def get_checkpoint_state(self):
            return {"position": self.position}

        def restore_from_checkpoint(self, state):
            self.position = state["position"]

    source = Source()
    model = small_model()
    ckpt = SparseCheckpoint(str(tmp_path), save_freq=2, data_source=source)

    class Advance(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            source.position += 32

    x = {"ids": np.arange(128, dtype="int64")}
    model.fit(
        x, np.ones(128, "float32"), batch_size=32, epochs=1, verbose=0, callbacks=[Advance(), ckpt]
    )
    assert [s for s, _ in ckpt.saves] == [2, 4]
    assert os.path.exists(tmp_path / "state-000000000004.json")
    npu_rec.table._registry.clear()
    fresh, source.position = small_model(), 0
    restore = SparseCheckpoint(str(tmp_path), data_source=source, restore=True)
    npu_rec.init(restore_model_version=2, if_load=True)
    assert restore.prepare(fresh) == 2
    assert source.position == 64
