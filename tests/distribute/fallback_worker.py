"""The fallback scenario of `keras_worker.py`: `not_admitted="hashed"` tables under `fit`.

Two hashed tables (SGD, and bfloat16 rows with RowWiseAdagrad) and one without a
fallback train 30 steps, then an evaluation of 3; kept: each table's keys, rows,
counts, slots and its fallback (rows, slots, step).
"""

import keras
import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding

STEPS, BATCH, EVAL_STEPS = 30, 64, 3


def data() -> tf.data.Dataset:
    rng = np.random.default_rng(5)
    n = STEPS * BATCH
    user = rng.zipf(1.4, n).astype(np.int64) % 3000
    items = (rng.zipf(1.3, (n, 2)).astype(np.int64) % 9000) * 104729
    label = ((user % 3 == 0) ^ (items[:, 0] % 2 == 0)).astype(np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices(({"user": user, "items": items}, label)).batch(BATCH)


def build(out_dir: str, multi: bool):
    del out_dir, multi  # the same tables on the workers and in one process
    keras.utils.set_random_seed(1)
    user = keras.Input(shape=(), dtype="int64", name="user")
    items = keras.Input(shape=(2,), dtype="int64", name="items")
    u = SparseEmbedding(
        "user_fb",
        8,
        optimizer=npu_rec.optimizers.SGD(0.05),
        access_threshold=3,
        not_admitted="hashed",
        fallback_buckets=64,
    )(user)
    i = SparseEmbedding(
        "item_fb",
        4,
        combiner="sum",
        optimizer=npu_rec.optimizers.RowWiseAdagrad(0.05),
        access_threshold=2,
        not_admitted="hashed",
        fallback_buckets=32,
        value_dtype="bfloat16",
    )(items)
    p = SparseEmbedding("plain", 4, optimizer=npu_rec.optimizers.SGD(0.05), access_threshold=2)(
        user
    )
    x = keras.layers.Concatenate()([u, i, p])
    x = keras.layers.Dense(8, activation="relu")(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = RecModel({"user": user, "items": items}, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return model


def inspect(model, out_dir: str) -> dict:
    del model, out_dir
    return {}


def keep(field: str) -> bool:
    return field in ("keys", "values", "counts") or field.startswith(("fallback/", "slot/"))
