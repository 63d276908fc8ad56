"""One run of the tiered multi-worker scenario: tables with a disk tier under Keras `fit`.

Run under `python -m npu_rec.launch --workers 2` (each worker trains on its half of
every global batch) with tiered tables: `memory_rows` so small that every step
promotes and demotes on both workers, one `ssd_path` for both; worker 0 keeps the
default lookup path (the compiled kernels where they build), worker 1 takes the
stock path (`NPU_REC_KERNELS=off`), so each owner's lookups go through the other
backend's tier. Run alone: one process with the same tables in memory.

Tables: "user_t" (Adagrad), "item_t" (Adam, `access_threshold=2`,
`not_admitted="hashed"`, looked up twice per step: the items and the clicked
item through one `SparseEmbedding`). 12 steps, then an evaluation. Writes
`<out>/tier_<rank or single>.npz` (per-step losses, evaluation loss, each table's
export with its slots and fallback, and on the workers the tier's counters and
directories) and saves the tables with `npu_rec.distribute.save_tables` into
`<out>/tier_ckpt_<multi|single>`.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MULTI = "TF_CONFIG" in os.environ
if MULTI and json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
    os.environ["NPU_REC_KERNELS"] = "off"  # worker 1: the stock path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if MULTI:  # before any other TensorFlow op
    import npu_rec.distribute  # noqa: E402

    STRATEGY = npu_rec.distribute.multi_worker_strategy(timeout_seconds=60)
else:
    STRATEGY = tf.distribute.get_strategy()

import keras  # noqa: E402

import npu_rec  # noqa: E402
from npu_rec.keras import RecModel, SparseEmbedding  # noqa: E402

STEPS, BATCH = 12, 48
#: Rows in memory per table (divided between the workers: 4 and 3 per worker).
MEMORY_ROWS = {"user_t": 8, "item_t": 6}
RANK = npu_rec.distribute.worker_rank(STRATEGY) if MULTI else 0


def data():
    rng = np.random.default_rng(9)
    n = STEPS * BATCH
    user = rng.zipf(1.3, n).astype(np.int64) % 400
    items = (rng.zipf(1.2, (n, 2)).astype(np.int64) % 600) * 7919
    clicked = (rng.zipf(1.2, n).astype(np.int64) % 600) * 7919
    label = ((user % 3 == 0) ^ (items[:, 0] % 2 == 0)).astype(np.float32)[:, None]
    features = {"user": user, "items": items, "clicked": clicked}
    ds = tf.data.Dataset.from_tensor_slices((features, label)).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).repeat()


def tier(name: str, ssd: str) -> dict:
    return {"memory_rows": MEMORY_ROWS[name], "ssd_path": ssd} if MULTI else {}


def build(ssd: str):
    keras.utils.set_random_seed(1)
    user = keras.Input(shape=(), dtype="int64", name="user")
    items = keras.Input(shape=(2,), dtype="int64", name="items")
    clicked = keras.Input(shape=(), dtype="int64", name="clicked")
    u = SparseEmbedding(
        "user_t", 8, optimizer=npu_rec.optimizers.Adagrad(0.05), **tier("user_t", ssd)
    )(user)
    item = SparseEmbedding(
        "item_t",
        4,
        combiner="sum",
        optimizer=npu_rec.optimizers.Adam(0.01),
        access_threshold=2,
        not_admitted="hashed",
        fallback_buckets=16,
        **tier("item_t", ssd),
    )
    x = keras.layers.Concatenate()([u, item(items), item(clicked[:, None])])
    x = keras.layers.Dense(8, activation="relu")(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = RecModel({"user": user, "items": items, "clicked": clicked}, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return model


def main(out_dir: str) -> None:
    tag = str(RANK) if MULTI else "single"
    ssd = os.path.join(out_dir, "ssd")
    with STRATEGY.scope():
        model = build(ssd)
    history = model.fit(data(), epochs=STEPS, steps_per_epoch=1, verbose=0)
    result = {"loss": np.asarray(history.history["loss"])}
    if MULTI:  # both workers are alive here (the evaluation below needs them)
        result["ssd_entries"] = np.asarray(sorted(os.listdir(ssd)))
        for table in model.tables:
            store = table.local.state.store
            result[f"{table.name}/dirs"] = np.asarray(store.dirs)
            result[f"{table.name}/dirs_exist"] = np.asarray([os.path.isdir(d) for d in store.dirs])
            result[f"{table.name}/backend"] = np.asarray(table.local.backend.name)
            result[f"{table.name}/memory_rows"] = np.asarray(table.local.config.memory_rows)
            for k, v in table.tier_stats().items():
                result[f"{table.name}/tier/{k}"] = np.asarray(v)
    result["eval_loss"] = np.asarray(model.evaluate(data(), steps=2, verbose=0))
    for table in model.tables:
        state = table.read_state()
        for field, value in state.items():
            if not field.startswith("pending_"):
                result[f"{table.name}/{field}"] = np.asarray(value).astype(
                    np.float32 if np.asarray(value).dtype.kind == "V" else np.asarray(value).dtype
                )
    npu_rec.distribute.save_tables(
        os.path.join(out_dir, "tier_ckpt_multi" if MULTI else "tier_ckpt_single"),
        model.tables,
        STEPS,
    )
    np.savez(os.path.join(out_dir, f"tier_{tag}.npz"), **result)
    print(f"done {tag}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
