"""Keras on the fixed-shape data path: sparse multi-valued ids train and serve like ragged ones."""

import json
import subprocess
import sys

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.data import ParquetSource, as_dataset
from npu_rec.keras import RecModel, SparseEmbedding, export_for_serving
from npu_rec.table import _registry as _table_registry

PAD_LENGTH = 4
BATCH = 16


def _parquet(path, rows=64, seed=0) -> str:
    """Integer list ids (raw, not hashed) with many -1s, rows of 0-4 ids, a learnable label."""
    rng = np.random.default_rng(seed)
    tags = [
        rng.choice([-1, -1, 2, 3, 5, 8, 13], rng.integers(0, PAD_LENGTH + 1)).tolist()
        for _ in range(rows)
    ]
    label = [float(-1 in t) for t in tags]
    pq.write_table(pa.table({"click": label, "tags": pa.array(tags, pa.list_(pa.int64()))}), path)
    return str(path)


def _model(sparse: bool) -> RecModel:
    keras.utils.set_random_seed(0)
    shape = (PAD_LENGTH,) if sparse else (None,)
    tags = keras.Input(shape=shape, dtype="int64", name="tags", sparse=sparse, ragged=not sparse)
    emb = SparseEmbedding("tags", 4, combiner="mean", optimizer=npu_rec.optimizers.Adagrad(0.1))(
        tags
    )
    model = RecModel({"tags": tags}, keras.layers.Dense(1, activation="sigmoid")(emb))
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    return model


class _BatchLosses(keras.callbacks.Callback):
    # Per-batch logs: Keras' epoch mean over a dataset of static batch size and unknown
    # length counts one empty step at its end (a Keras behaviour, dense inputs too).
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])


def _fit(path: str, static: bool):
    _table_registry.clear()
    ds = as_dataset(
        ParquetSource(path, label="click", multi_valued=["tags"]),
        BATCH,
        use_dynamic=not static,
        pad_length=PAD_LENGTH,
    )
    model = _model(sparse=static)
    losses = _BatchLosses()
    model.fit(ds, epochs=3, verbose=0, callbacks=[losses])
    return model, losses.losses, model.tables[0].export()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = _parquet(tmp_path_factory.mktemp("fixed") / "tags.parquet")
    return path, _fit(path, static=True), _fit(path, static=False)


def test_fit_on_fixed_shapes_matches_ragged_and_looks_up_minus_one(runs):
    _, (model, static_loss, static_table), (ragged, ragged_loss, ragged_table) = runs
    assert model.inputs[0].sparse
    assert len(static_loss) == 12  # 3 epochs of 64 rows in batches of 16
    np.testing.assert_allclose(static_loss, ragged_loss, rtol=1e-5)
    assert static_loss[-1] < static_loss[0]  # it learns (the label is "has the id -1")
    for a, b in zip(model.get_weights(), ragged.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert static_table["keys"].tolist() == ragged_table["keys"].tolist()
    assert -1 in static_table["keys"].tolist()  # a raw id, trained like the others
    np.testing.assert_allclose(static_table["values"], ragged_table["values"], rtol=1e-5, atol=1e-6)


SERVE = """
import json, sys
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1])
p = json.loads(sys.argv[2])
out = served.signatures["serving_default"](
    tags_indices=tf.constant(p["indices"], tf.int64), tags_values=tf.constant(p["values"], tf.int64),
    tags_dense_shape=tf.constant(p["dense_shape"], tf.int64))["output_0"].numpy()
print(json.dumps({"npu_rec_imported": "npu_rec" in sys.modules, "out": out.tolist()}))
"""


def test_sparse_input_model_serves_without_npu_rec(tmp_path, runs):
    _, (model, _, _), _ = runs
    probe = tf.SparseTensor(
        [[0, 0], [0, 1], [1, 0], [3, 2]], tf.constant([-1, 5, 3, 999], tf.int64), [4, 4]
    )
    expected = model.predict({"tags": probe}, verbose=0)
    export_dir = export_for_serving(model, str(tmp_path / "serving"))
    loaded = tf.saved_model.load(export_dir)
    local = loaded.serve({"tags": probe}).numpy()
    np.testing.assert_allclose(local, expected, rtol=1e-5, atol=1e-6)
    arg = json.dumps(
        {
            "indices": probe.indices.numpy().tolist(),
            "values": probe.values.numpy().tolist(),
            "dense_shape": [4, 4],
        }
    )
    result = subprocess.run(
        [sys.executable, "-c", SERVE, export_dir, arg],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["npu_rec_imported"] is False
    np.testing.assert_allclose(np.array(served["out"]), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected[2], expected[0])  # row 2 (no ids) differs from row 0
