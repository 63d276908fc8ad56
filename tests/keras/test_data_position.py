"""The reading position of `npu_rec.data.as_dataset` is saved with every checkpoint.

`fit` / `online_train` on `as_dataset(source, ...)` with a `SparseCheckpoint`
that knows the source and the dataset's `reading_position`: the samples the
model consumed before a stop plus those consumed after a resume in a fresh
model, source and dataset equal the samples of an uninterrupted run, although
tf.data reads ahead of training.
"""

import keras
import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.data import CsvSource, as_dataset
from npu_rec.keras import RecModel, SparseEmbedding
from npu_rec.keras.callbacks import SparseCheckpoint

ROWS, BATCH = 100, 16  # a sweep is 6 batches of 16 and one of 4


class Recorder(keras.layers.Layer):
    """Appends the `row` values of every training batch to `log` (adds zero to the output)."""

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.extend = log.extend  # a bound method: Keras would copy a list attribute

    def call(self, rows, training=None):
        if not training:
            return tf.zeros_like(rows)

        def record(values):
            self.extend(int(v) for v in values.numpy())
            return 0.0

        done = tf.ensure_shape(tf.py_function(record, [rows], tf.float32), [])
        return tf.zeros_like(rows) * done


def write_csv(path):
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        f.write("label,row,cat\n")
        for i in range(ROWS):
            f.write(f"{i % 2},{i},c{rng.integers(0, 20)}\n")
    return str(path)


def source(csv):
    return CsvSource(csv, label="label", dense=["row"], categorical=["cat"])


def model_and_dataset(csv, log):
    """A fresh table registry, model, source and endless dataset (a restarted program)."""
    npu_rec.table._registry.clear()
    keras.utils.set_random_seed(0)
    row = keras.Input(shape=(), name="row")
    cat = keras.Input(shape=(), dtype="int64", name="cat")
    emb = SparseEmbedding("cat", 4, optimizer=npu_rec.optimizers.Adagrad(0.1))(cat)
    out = keras.layers.Dense(1, activation="sigmoid")(emb)
    out = out + keras.ops.expand_dims(Recorder(log)(row), -1)
    model = RecModel({"row": row, "cat": cat}, out)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    src = source(csv)
    return model, src, as_dataset(src, BATCH, num_sweeps=None)


def uninterrupted(csv, num_batches):
    """The `row` values of the first `num_batches` batches, read straight from the source."""
    src, rows = source(csv), []
    for _ in range(num_batches):
        rows.extend(int(v) for v in src.next_minibatch(BATCH)[src.stream("row")].data)
    return rows


def test_fit_stop_and_resume_neither_loses_nor_repeats_a_sample(tmp_path):
    csv, directory = write_csv(tmp_path / "data.csv"), str(tmp_path / "ckpt")
    npu_rec.init()
    first = []
    model, src, ds = model_and_dataset(csv, first)
    ckpt = SparseCheckpoint(
        directory, save_freq=3, data_source=src, reading_position=ds.reading_position
    )
    model.fit(ds, epochs=1, steps_per_epoch=5, verbose=0, callbacks=[ckpt])
    assert ds.reading_position.produced > 5  # tf.data read ahead of training
    # A second call on the same dataset continues at the first unconsumed batch.
    model.fit(ds, epochs=1, steps_per_epoch=3, verbose=0, callbacks=[ckpt])
    assert [s for s, _ in ckpt.saves] == [3, 5, 6, 8]
    assert first == uninterrupted(csv, 8)

    # A restarted program resumes at step 8 with the next unread sample.
    npu_rec.shutdown()
    npu_rec.init(if_load=True)
    second = []
    model, src, ds = model_and_dataset(csv, second)
    ckpt = SparseCheckpoint(directory, data_source=src, reading_position=ds.reading_position)
    model.fit(ds, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[ckpt])
    assert ckpt.restored_step == 8 and model.global_step == 12
    assert first + second == uninterrupted(csv, 12)  # across a sweep end (7 batches)

    # Killed after step 3's checkpoint: only the samples after it are read again.
    npu_rec.shutdown()
    npu_rec.init(if_load=True, restore_model_version=3)
    third = []
    model, src, ds = model_and_dataset(csv, third)
    ckpt = SparseCheckpoint(directory, data_source=src, reading_position=ds.reading_position)
    model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[ckpt])
    assert ckpt.restored_step == 3
    assert first[: 3 * BATCH] + third == uninterrupted(csv, 5)


def test_online_train_resumes_at_the_next_unread_sample(tmp_path):
    csv, directory = write_csv(tmp_path / "data.csv"), str(tmp_path / "ckpt")
    npu_rec.init(max_steps=5, save_steps=2)
    first = []
    model, src, ds = model_and_dataset(csv, first)
    ckpt = SparseCheckpoint(directory, data_source=src, reading_position=ds.reading_position)
    model.online_train(ds, callbacks=[ckpt], dataset_sink_mode=False)
    assert model.global_step == 5 and [s for s, _ in ckpt.saves] == [2, 4, 5]

    npu_rec.shutdown()
    npu_rec.init(max_steps=9, save_steps=2, if_load=True)
    second = []
    model, src, ds = model_and_dataset(csv, second)
    ckpt = SparseCheckpoint(directory, data_source=src, reading_position=ds.reading_position)
    model.online_train(ds, callbacks=[ckpt], dataset_sink_mode=True, sink_size=2)
    assert ckpt.restored_step == 5 and model.global_step == 9
    assert first + second == uninterrupted(csv, 9)
