"""One run of the multi-worker `fit` scenario: 50 steps, SGD then Adagrad tables.

Both models are compiled with `metrics=["mae"]`; each step's logs (as per-batch
callbacks see them) and each epoch's are recorded.

Run under `python -m npu_rec.launch --workers 2` (each worker trains on its half of
every global batch) or alone (one process on the whole global batches). Writes
`<out>/<rank or single>.npz` with the per-step losses and each table's export.

The SGD run checkpoints with `SparseCheckpoint` (full saves every 20 steps, timed
delta saves on a clock that runs at a different rate on each worker) into
`<out>/keras_<multi|single>`; the two-worker run then restores the one-process
checkpoint (1 -> 2). Then, in both runs, one model trains with `Evict` on a
timestamp clock and `AccelerateTrain("fast|step|0.5")` (float16 with loss scaling,
then float32), and meets the errors of `StepConsistency`, `steps_per_execution=2`
and a sink of 2 steps.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MULTI = "TF_CONFIG" in os.environ
if MULTI:  # before any other TensorFlow op
    import npu_rec.distribute  # noqa: E402

    STRATEGY = npu_rec.distribute.multi_worker_strategy(timeout_seconds=60)
    # No collective timeout (a thread per collective); a watchdog bounds a lost worker.
    assert npu_rec.distribute._tf_private.strategy_timeout(STRATEGY) is None
    assert npu_rec.distribute._faults.watchdog().bound_seconds == 60
else:
    STRATEGY = tf.distribute.get_strategy()

import keras  # noqa: E402

import npu_rec  # noqa: E402
from npu_rec.keras import RecModel, SparseEmbedding  # noqa: E402
from npu_rec.keras import callbacks as kcb  # noqa: E402

STEPS, BATCH = 50, 64
EVICT_STEPS = 10
RANK = npu_rec.distribute.worker_rank(STRATEGY) if MULTI else 0


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
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["mae"])
    return model


class BatchLogs(keras.callbacks.Callback):
    """The logs `fit` passes to `on_train_batch_end`, per name, one value a step."""

    def __init__(self):
        super().__init__()
        self.logs: dict = {}

    def on_train_batch_end(self, batch, logs=None):
        for name, value in (logs or {}).items():
            self.logs.setdefault(name, []).append(float(np.asarray(value)))


def step_collectives(fit) -> dict:
    """Collective ops per kind in the graph of the training step that `fit` traces and runs.

    TensorFlow records the graph of every function it runs while run metadata is on;
    the step's graph is the one that reads the batch with the most collectives.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        out = fit()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    best: dict = {}
    for function in metadata.function_graphs:
        graphs = function.partition_graphs
        nodes = [n for g in graphs for n in g.node]
        nodes += [n for g in graphs for f in g.library.function for n in f.node_def]
        if any(n.op == "IteratorGetNext" for n in nodes):
            counts: dict = {}
            for n in nodes:
                if n.op.startswith("Collective"):
                    counts[n.op] = counts.get(n.op, 0) + 1
            if sum(counts.values()) > sum(best.values()):
                best = counts
    return best, out


def _export(result: dict, prefix: str, model) -> None:
    for table in model.tables:
        for field, value in table.export().items():
            if field != "slots":
                result[f"{prefix}/{table.name}/{field}"] = value
    for i, w in enumerate(model.weights):
        result[f"{prefix}/dense{i}"] = np.asarray(w.numpy())


def evict_data():
    """Users drifting over time, with a timestamp (seconds) of 10 x the step."""
    rng = np.random.default_rng(11)
    step = np.repeat(np.arange(EVICT_STEPS), BATCH)
    user = (rng.zipf(1.3, step.size).astype(np.int64) + step * 97) % 5000
    label = (user % 2 == 0).astype(np.float32)[:, None]
    ds = tf.data.Dataset.from_tensor_slices(({"user": user, "ts": step * 10}, label)).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def run_callbacks(result: dict) -> None:
    """`Evict` on the timestamp clock with `AccelerateTrain`, then the refused settings."""
    with STRATEGY.scope():
        user = keras.Input(shape=(), dtype="int64", name="user")
        ts = keras.Input(shape=(), dtype="int64", name="ts")
        emb = SparseEmbedding(
            "user_evict",
            8,
            optimizer=npu_rec.optimizers.SGD(0.05),
            access_threshold=0,
            eviction_threshold=30,
        )
        hidden = keras.layers.Dense(8, activation="relu")(emb(user, timestamps=ts))
        out = keras.layers.Dense(1, activation="sigmoid")(hidden)
        model = RecModel({"user": user, "ts": ts}, out)
        # A loss scale too large for float16: the first steps overflow and are skipped
        # (by every worker together) while the scale halves.
        lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2**20)
        model.compile(optimizer=lso, loss="binary_crossentropy")
    # The clock of the eviction: the newest timestamp trained on (the global batch's).
    evict = kcb.Evict(None, 5, now=lambda: (model.global_step - 1) * 10)
    acc = kcb.AccelerateTrain("fast|step|0.5", total_step=EVICT_STEPS)
    history = model.fit(
        evict_data(), epochs=EVICT_STEPS, steps_per_epoch=1, verbose=0, callbacks=[evict, acc]
    )
    result["evict/freed"] = np.asarray([freed["user_evict"] for _, freed in evict.evictions])
    result["evict/steps"] = np.asarray([step for step, _ in evict.evictions])
    result["acc/loss"] = np.asarray(history.history["loss"])
    result["acc/low"] = np.asarray(acc.low_precision_steps)
    result["acc/scale"] = np.asarray(model.optimizer.dynamic_scale.numpy())
    result["acc/step"] = np.asarray(model.global_step)
    _export(result, "evict", model)
    run_refusals(result, model)


def run_refusals(result: dict, model) -> None:
    """The messages of settings that stop a run before it trains."""
    npu_rec.init(max_steps=7)
    try:
        model.fit(evict_data(), epochs=3, steps_per_epoch=1, verbose=0)
    except npu_rec.ConfigError as err:
        result["errors/steps"] = np.asarray(str(err))
    npu_rec.init()
    model.compile(optimizer="sgd", loss="binary_crossentropy", steps_per_execution=2)
    try:
        model.fit(evict_data(), epochs=1, steps_per_epoch=2, verbose=0)
        result["errors/spe"] = np.asarray("trained")
    except ValueError as err:
        result["errors/spe"] = np.asarray(str(err))
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    try:
        npu_rec.init(max_steps=model.global_step + 2)
        model.online_train(evict_data(), dataset_sink_mode=True, sink_size=2)
        result["errors/sink"] = np.asarray("trained")
    except ValueError as err:
        result["errors/sink"] = np.asarray(str(err))
    npu_rec.init()


def _checkpoint(out_dir: str, model):
    """Full saves every 20 steps and delta saves every 7 clock seconds; worker 1's
    clock runs 1.7 times as fast, so alone the workers would save at different steps."""
    rate = 1.7 if RANK == 1 else 1.0
    return kcb.SparseCheckpoint(
        os.path.join(out_dir, "keras_multi" if MULTI else "keras_single"),
        save_freq=20,
        clock=lambda: model.global_step * rate,
    )


def _timed(label, fn, *args):
    start = time.time()
    fn(*args)
    print(f"{label}: {time.time() - start:.1f} s", flush=True)


def main(out_dir: str) -> None:
    tag = str(RANK) if MULTI else "single"
    npu_rec.init(
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=1000,
        save_delta_checkpoints_secs=7,
    )
    result = {}
    for opt_name in ("sgd", "adagrad"):
        with STRATEGY.scope():
            model = build(opt_name)
        batch_logs = BatchLogs()
        callbacks = [batch_logs] + ([_checkpoint(out_dir, model)] if opt_name == "sgd" else [])

        def fit(model=model, callbacks=callbacks):
            return model.fit(
                data(), epochs=STEPS, steps_per_epoch=1, verbose=0, callbacks=callbacks
            )

        if MULTI and opt_name == "adagrad":
            counts, history = step_collectives(fit)
            result["adagrad/all_reduces"] = np.asarray(counts.get("CollectiveReduceV2", 0))
            result["adagrad/all_to_alls"] = np.asarray(counts.get("CollectiveAllToAllV2", 0))
        else:
            history = fit()
        result[f"{opt_name}/loss"] = np.asarray(history.history["loss"])
        result[f"{opt_name}/mae"] = np.asarray(history.history["mae"])
        for name in ("loss", "mae"):
            result[f"{opt_name}/step_{name}"] = np.asarray(batch_logs.logs[name])
        if opt_name == "sgd":  # evaluation and prediction look the tables up too
            if MULTI:
                counts, (loss, mae) = step_collectives(
                    lambda model=model: model.evaluate(data(), steps=5, verbose=0)
                )
                result["sgd/eval_all_reduces"] = np.asarray(counts.get("CollectiveReduceV2", 0))
                result["sgd/eval_all_to_alls"] = np.asarray(counts.get("CollectiveAllToAllV2", 0))
            else:
                loss, mae = model.evaluate(data(), steps=5, verbose=0)
            result["sgd/eval_loss"], result["sgd/eval_mae"] = np.asarray(loss), np.asarray(mae)
            result["sgd/predict"] = model.predict(data(), steps=2, verbose=0)
        for table in model.tables:
            for field, value in table.export().items():
                if field != "slots":
                    result[f"{opt_name}/{table.name}/{field}"] = value
            for slot, value in table.export()["slots"].items():
                result[f"{opt_name}/{table.name}/slot_{slot}"] = value
        if opt_name == "sgd":
            for i, w in enumerate(model.weights):
                result[f"sgd/dense{i}"] = np.asarray(w.numpy())
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
        # The one-process SparseCheckpoint, re-sharded onto the two workers (1 -> 2).
        npu_rec.shutdown()
        with STRATEGY.scope():
            model = build("sgd")
        ckpt = kcb.SparseCheckpoint(os.path.join(out_dir, "keras_single"), restore=True)
        result["keras_restored/step"] = np.asarray(ckpt.prepare(model))
        _export(result, "keras_restored", model)
    npu_rec.shutdown()
    _timed("callbacks", run_callbacks, result)
    np.savez(os.path.join(out_dir, f"{tag}.npz"), **result)
    print(f"done {tag}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
