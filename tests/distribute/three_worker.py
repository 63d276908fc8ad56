"""The 3-worker exactness scenario: 12 steps of two tables, one looked up by two layers.

Run under `python -m npu_rec.launch --workers 3` (each worker trains on its third of
every global batch) or alone (one process on the whole global batches). The user
table evicts (timestamps of 10 x the step, `Evict` every 4 steps), the item table
admits a key at its second sighting and is looked up twice per step (the items and
the clicked item, one `SparseEmbedding` called twice). Writes `<out>/<rank or
single>.npz`: the per-step losses, the evaluation loss and each table's export.
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
from npu_rec.keras import callbacks as kcb  # noqa: E402

STEPS, BATCH = 12, 48


def data():
    rng = np.random.default_rng(3)
    n = STEPS * BATCH
    step = np.repeat(np.arange(STEPS), BATCH)
    user = (rng.zipf(1.3, n).astype(np.int64) + step * 31) % 3000
    items = (rng.zipf(1.2, (n, 3)).astype(np.int64) % 5000) * 7919
    clicked = (rng.zipf(1.2, n).astype(np.int64) % 5000) * 7919
    label = ((user % 3 == 0) ^ (items[:, 0] % 2 == 0)).astype(np.float32)[:, None]
    features = {"user": user, "ts": step * 10, "items": items, "clicked": clicked}
    ds = tf.data.Dataset.from_tensor_slices((features, label)).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).repeat()


def build():
    keras.utils.set_random_seed(1)
    user = keras.Input(shape=(), dtype="int64", name="user")
    ts = keras.Input(shape=(), dtype="int64", name="ts")
    items = keras.Input(shape=(3,), dtype="int64", name="items")
    clicked = keras.Input(shape=(), dtype="int64", name="clicked")
    u = SparseEmbedding(
        "user3",
        8,
        optimizer=npu_rec.optimizers.Adagrad(0.05),
        access_threshold=0,
        eviction_threshold=30,
    )(user, timestamps=ts)
    item = SparseEmbedding(
        "item3", 8, combiner="sum", optimizer=npu_rec.optimizers.SGD(0.05), access_threshold=2
    )
    x = keras.layers.Concatenate()([u, item(items), item(clicked[:, None])])
    x = keras.layers.Dense(16, activation="relu")(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = RecModel({"user": user, "ts": ts, "items": items, "clicked": clicked}, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return model


def main(out_dir: str) -> None:
    with STRATEGY.scope():
        model = build()
    evict = kcb.Evict(None, 4, now=lambda: (model.global_step - 1) * 10)
    history = model.fit(data(), epochs=STEPS, steps_per_epoch=1, verbose=0, callbacks=[evict])
    result = {
        "loss": np.asarray(history.history["loss"]),
        "eval_loss": np.asarray(model.evaluate(data(), steps=3, verbose=0)),
        "freed": np.asarray([sum(freed.values()) for _, freed in evict.evictions]),
    }
    for table in model.tables:
        for field, value in table.export().items():
            if field != "slots":
                result[f"{table.name}/{field}"] = value
    tag = str(npu_rec.distribute.worker_rank(STRATEGY)) if MULTI else "single"
    np.savez(os.path.join(out_dir, f"{tag}.npz"), **result)
    print(f"done {tag}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
