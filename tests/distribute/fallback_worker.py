"""One run of the multi-worker fallback scenario: `not_admitted="hashed"` tables under `fit`.

Run under `python -m npu_rec.launch --workers 2` (each worker trains on its half of
every global batch) or alone (one process on the whole global batches). Two
hashed tables (SGD, and bfloat16 rows with RowWiseAdagrad) and one without a
fallback train 30 steps; the run writes `<out>/fallback_<rank or single>.npz`
with the per-step losses, an evaluation, each table's export and its fallback
(rows, slots, step), and saves the tables with `npu_rec.distribute.save_tables`
into `<out>/fallback_ckpt_<multi|single>`.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MULTI = "TF_CONFIG" in os.environ
if MULTI:  # before any other TensorFlow op
    import npu_rec.distribute  # noqa: E402

    STRATEGY = npu_rec.distribute.multi_worker_strategy(timeout_seconds=60)
else:
    STRATEGY = tf.distribute.get_strategy()

import keras  # noqa: E402

import npu_rec  # noqa: E402
from npu_rec.keras import RecModel, SparseEmbedding  # noqa: E402

STEPS, BATCH = 30, 64
RANK = npu_rec.distribute.worker_rank(STRATEGY) if MULTI else 0


def data():
    rng = np.random.default_rng(5)
    n = STEPS * BATCH
    user = rng.zipf(1.4, n).astype(np.int64) % 3000
    items = (rng.zipf(1.3, (n, 2)).astype(np.int64) % 9000) * 104729
    label = ((user % 3 == 0) ^ (items[:, 0] % 2 == 0)).astype(np.float32)[:, None]
    ds = tf.data.Dataset.from_tensor_slices(({"user": user, "items": items}, label)).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).repeat()


def build():
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


def main(out_dir: str) -> None:
    tag = str(RANK) if MULTI else "single"
    with STRATEGY.scope():
        model = build()
    history = model.fit(data(), epochs=STEPS, steps_per_epoch=1, verbose=0)
    result = {"loss": np.asarray(history.history["loss"])}
    result["eval_loss"] = np.asarray(model.evaluate(data(), steps=3, verbose=0))
    for table in model.tables:
        state = table.read_state()
        for field, value in state.items():
            if field in ("keys", "values", "counts") or field.startswith(("fallback/", "slot/")):
                result[f"{table.name}/{field}"] = np.asarray(value).astype(
                    np.float32 if np.asarray(value).dtype.kind == "V" else np.asarray(value).dtype
                )
    npu_rec.distribute.save_tables(
        os.path.join(out_dir, "fallback_ckpt_multi" if MULTI else "fallback_ckpt_single"),
        model.tables,
        STEPS,
    )
    np.savez(os.path.join(out_dir, f"fallback_{tag}.npz"), **result)
    print(f"done {tag}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
