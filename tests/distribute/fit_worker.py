"""One run of the multi-worker `fit` scenario: 50 steps, SGD then Adagrad tables.

Run under `python -m npu_rec.launch --workers 2` (each worker trains on its half of
every global batch) or alone (one process on the whole global batches). Writes
`<out>/<rank or single>.npz` with the per-step losses and each table's export.
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
    assert npu_rec.distribute._tf_private.strategy_timeout(STRATEGY) == 60
else:
    STRATEGY = tf.distribute.get_strategy()

import keras  # noqa: E402

import npu_rec  # noqa: E402
from npu_rec.keras import RecModel, SparseEmbedding  # noqa: E402

STEPS, BATCH = 50, 64


def data(seed: int = 7):
    rng = np.random.default_rng(seed)
    n = STEPS * BATCH
    user = rng.zipf(1.3, n).astype(np.int64) % 5000
    items = (rng.zipf(1.2, (n, 3)).astype(np.int64) % 20000) * 7919
    dense = rng.normal(size=(n, 4)).astype(np.float32)
    label = ((user % 3 == 0) ^ (items[:, 0] % 2 == 0)).astype(np.float32)[:, None]
    ds = tf.data.Dataset.from_tensor_slices(
        ({"user": user, "items": items, "feats": dense}, label)
    ).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).repeat()


def build(opt_name: str):
    make = {
        "sgd": lambda: npu_rec.optimizers.SGD(0.05),
        "adagrad": lambda: npu_rec.optimizers.Adagrad(0.05),
    }[opt_name]
    keras.utils.set_random_seed(1)
    user = keras.Input(shape=(), dtype="int64", name="user")
    items = keras.Input(shape=(3,), dtype="int64", name="items")
    dense = keras.Input(shape=(4,), dtype="float32", name="feats")
    u = SparseEmbedding(f"user_{opt_name}", 8, optimizer=make())(user)
    i = SparseEmbedding(
        f"item_{opt_name}", 8, combiner="sum", optimizer=make(), access_threshold=2
    )(items)
    x = keras.layers.Concatenate()([u, i, dense])
    x = keras.layers.Dense(16, activation="relu")(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = RecModel({"user": user, "items": items, "feats": dense}, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    return model


def main(out_dir: str) -> None:
    tag = str(npu_rec.distribute.worker_rank(STRATEGY)) if MULTI else "single"
    result = {}
    for opt_name in ("sgd", "adagrad"):
        with STRATEGY.scope():
            model = build(opt_name)
        history = model.fit(data(), epochs=STEPS, steps_per_epoch=1, verbose=0)
        result[f"{opt_name}/loss"] = np.asarray(history.history["loss"])
        if opt_name == "sgd":  # evaluation and prediction look the tables up too
            result["sgd/eval_loss"] = np.asarray(model.evaluate(data(), steps=5, verbose=0))
            result["sgd/predict"] = model.predict(data(), steps=2, verbose=0)
        for table in model.tables:
            for field, value in table.export().items():
                if field != "slots":
                    result[f"{opt_name}/{table.name}/{field}"] = value
            for slot, value in table.export()["slots"].items():
                result[f"{opt_name}/{table.name}/slot_{slot}"] = value
        # Checkpoints: the SGD tables of this run, and a re-shard of the one-process save.
        if opt_name == "sgd":
            npu_rec.distribute.save_tables(
                os.path.join(out_dir, "ckpt_multi" if MULTI else "ckpt_single"), model.tables, STEPS
            )
    if MULTI:
        npu_rec.shutdown()  # forget the tables, to re-create them under the same names
        with STRATEGY.scope():
            model = build("sgd")
        step = npu_rec.distribute.restore_tables(os.path.join(out_dir, "ckpt_single"), model.tables)
        assert step == STEPS, step
        for table in model.tables:
            for field in ("keys", "values", "counts"):
                result[f"restored/{table.name}/{field}"] = table.export()[field]
    np.savez(os.path.join(out_dir, f"{tag}.npz"), **result)
    print(f"done {tag}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
