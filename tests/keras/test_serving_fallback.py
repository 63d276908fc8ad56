"""A `SparseEmbedding` with `not_admitted="hashed"`: `.keras` files and the serving export keep
the fallback, and the SavedModel serves ids without a row from their fallback rows."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding, export_for_serving


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def trained(request):
    """The fallback rows stored in float32, or compact (bfloat16, served as float32)."""
    keras.utils.set_random_seed(0)
    user = keras.Input(shape=(), dtype="int64", name="user")
    emb = SparseEmbedding(
        f"fb_user_{request.param}",
        4,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=3,
        not_admitted="hashed",
        fallback_buckets=16,
        value_dtype=request.param,
    )
    out = keras.layers.Dense(1, activation="sigmoid")(emb(user))
    model = RecModel(user, out)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 200, 512).astype(np.int64)  # most ids stay below the threshold
    model.fit(x, (x % 2).astype("float32"), batch_size=64, epochs=1, verbose=0)
    probe = np.array([*x[:6], 10**9 + 7, -5, 4242], np.int64)  # the last three are unknown
    return model, emb, probe


def test_the_fallback_is_trained_and_read_by_unknown_ids(trained):
    model, emb, probe = trained
    table = emb.table
    assert table.fallback is not None and int(table.fallback.step.numpy()) > 0
    assert table.fallback.values.dtype == table.config.value_dtype  # stored as the rows are
    unknown = npu_rec.sparse_lookup(table, tf.constant(probe[-3:]), is_training=False).numpy()
    assert np.all(np.abs(unknown).sum(axis=1) > 0)  # not the zero vector


def test_serving_savedmodel_reads_the_fallback_rows(tmp_path, trained):
    model, _, probe = trained
    expected = model.predict(probe, verbose=0)
    export_dir = export_for_serving(model, str(tmp_path / "serving"))
    served = tf.saved_model.load(export_dir)
    out = served.signatures["serving_default"](user=tf.constant(probe))["output_0"].numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_keras_file_round_trips_the_fallback(tmp_path, trained):
    model, emb, probe = trained
    expected = model.predict(probe, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(probe, verbose=0), expected)
    np.testing.assert_array_equal(
        loaded.tables[0].fallback.values.numpy(), emb.table.fallback.values.numpy()
    )
