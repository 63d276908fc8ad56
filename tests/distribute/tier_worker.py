"""The tiered scenario of `keras_worker.py`: tables with a disk tier under Keras `fit`.

On the workers the tables are tiered: `memory_rows` so small that every step
promotes and demotes on both workers, one `ssd_path` (`<out>/ssd`) for both; in
one process the same tables are in memory. Tables: "user_t" (Adagrad), "item_t"
(Adam, `access_threshold=2`, `not_admitted="hashed"`, looked up twice per step:
the items and the clicked item through one `SparseEmbedding`). 12 steps, then an
evaluation of 2; every state field is kept, and the workers add the tier's
counters, directories and backend.
"""

import os

import keras
import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding

STEPS, BATCH, EVAL_STEPS = 12, 48, 2
#: Rows in memory per table (divided between the workers: 4 and 3 per worker).
MEMORY_ROWS = {"user_t": 8, "item_t": 6}


def data() -> tf.data.Dataset:
    rng = np.random.default_rng(9)
    n = STEPS * BATCH
    user = rng.zipf(1.3, n).astype(np.int64) % 400
    items = (rng.zipf(1.2, (n, 2)).astype(np.int64) % 600) * 7919
    clicked = (rng.zipf(1.2, n).astype(np.int64) % 600) * 7919
    label = ((user % 3 == 0) ^ (items[:, 0] % 2 == 0)).astype(np.float32)[:, None]
    features = {"user": user, "items": items, "clicked": clicked}
    return tf.data.Dataset.from_tensor_slices((features, label)).batch(BATCH)


def build(out_dir: str, multi: bool):
    ssd = os.path.join(out_dir, "ssd")

    def tier(name: str) -> dict:
        return {"memory_rows": MEMORY_ROWS[name], "ssd_path": ssd} if multi else {}

    keras.utils.set_random_seed(1)
    user = keras.Input(shape=(), dtype="int64", name="user")
    items = keras.Input(shape=(2,), dtype="int64", name="items")
    clicked = keras.Input(shape=(), dtype="int64", name="clicked")
    u = SparseEmbedding("user_t", 8, optimizer=npu_rec.optimizers.Adagrad(0.05), **tier("user_t"))(
        user
    )
    item = SparseEmbedding(
        "item_t",
        4,
        combiner="sum",
        optimizer=npu_rec.optimizers.Adam(0.01),
        access_threshold=2,
        not_admitted="hashed",
        fallback_buckets=16,
        **tier("item_t"),
    )
    x = keras.layers.Concatenate()([u, item(items), item(clicked[:, None])])
    x = keras.layers.Dense(8, activation="relu")(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = RecModel({"user": user, "items": items, "clicked": clicked}, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return model


def inspect(model, out_dir: str) -> dict:
    """Each table's tier on this worker: directories, backend, memory rows, counters."""
    result = {"ssd_entries": np.asarray(sorted(os.listdir(os.path.join(out_dir, "ssd"))))}
    for table in model.tables:
        store = table.local.state.store
        result[f"{table.name}/dirs"] = np.asarray(store.dirs)
        result[f"{table.name}/dirs_exist"] = np.asarray([os.path.isdir(d) for d in store.dirs])
        result[f"{table.name}/backend"] = np.asarray(table.local.backend.name)
        result[f"{table.name}/memory_rows"] = np.asarray(table.local.config.memory_rows)
        for k, v in table.tier_stats().items():
            result[f"{table.name}/tier/{k}"] = np.asarray(v)
    return result


def keep(field: str) -> bool:
    return not field.startswith("pending_")
