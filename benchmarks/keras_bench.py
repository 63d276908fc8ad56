"""DLRM-style training throughput: npu_rec RecModel.fit against the alternatives.

All runs train the same DLRM-style model on the same pre-generated batches:
26 categorical features of raw int64 ids (Zipf alpha 1.05 over about
`--distinct_ids` ids split across the features like Criteo's), 13 dense
features, embedding dim 16, bottom MLP 13-64-16, top MLP 432-256-128-1,
binary cross-entropy, Adam on the dense part, Adagrad on the embeddings.

  npu_rec     RecModel.fit, one SparseEmbedding table per feature, admission
              (access_threshold=1) and eviction (eviction_threshold + an Evict
              callback firing every --evict_every steps) on
  npu_rec_stock  the same on the stock TensorFlow ops (NPU_REC_KERNELS=off while
              its model is built and traced): what the compiled kernels gain
  npu_rec_plain  the same without admission and eviction (only with --runs)
  npu_rec_one_table  the same with one table for all 26 features (table
              batching: one lookup of [batch, 26] ids; only with --runs)
  keras       plain Keras 3 fit: Hashing(--hash_buckets) + Embedding, Adagrad
  torchrec    TorchRec FusedEmbeddingBagCollection (one table per feature,
              min(vocab, --hash_buckets) rows) with FBGEMM's fused row-wise
              Adagrad, the same MLP in PyTorch, ids hashed by modulo in the step;
              in a worker process without TensorFlow (torchrec_worker.py)
  torchrec_small  the same with at most --small_buckets rows per table
  tf_loop     hand-written tf.function loop: fixed tf.Variable tables of
              min(vocab, --hash_buckets) rows, tf.unique + sparse Adagrad
  mlp_only    the dense MLP alone: Keras fit of the same MLP, loss and
              optimizer on pre-gathered random embeddings fed as inputs (the
              upper limit of any embedding implementation in this stack)

Method: every run is built and warmed up first (tracing excluded); then the
runs are timed in alternating blocks of --steps steps, --rounds times, so
that load from other processes on a shared machine hits all of them alike.
A Keras run's block is timed from its first step's start to its last step's
end, callbacks included (`_StepClock`): each `fit` call also creates and
deletes a data iterator, which took 0-1.2 s per call here for every Keras
model alike (not a per-step cost, and absent from a long `fit`).
Each run's figure is its median block rate (samples/s). Prints a table and
writes JSON.

The torchrec runs need the optional `bench` extra plus torchrec installed
without its dependencies (they would pull the CUDA fbgemm-gpu; fbgemm-gpu-cpu
1.9.0 fails to load with torch 2.13, hence 1.8.0):

  pip install -e ".[bench]"      # torch 2.13.0 (CPU), fbgemm-gpu-cpu 1.8.0, ...
  pip install --no-deps torchrec==1.8.0

Without them the torchrec rows say "skipped".

Example (quick):
  python benchmarks/keras_bench.py --steps 5 --rounds 2 --distinct_ids 1000000
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

_BATCH = flags.DEFINE_integer("batch_size", 4096, "Samples per step.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per block.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 3, "Timed blocks per run (alternating runs).", lower_bound=1
)
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps (tracing) per run.", lower_bound=1)
_BATCHES = flags.DEFINE_integer(
    "distinct_batches", 8, "Pre-generated batches, cycled.", lower_bound=1
)
_IDS = flags.DEFINE_integer(
    "distinct_ids", 10_000_000, "Distinct ids over all features.", lower_bound=26
)
_BUCKETS = flags.DEFINE_integer(
    "hash_buckets",
    2**20,
    "Rows per feature of keras (all features); the cap of "
    "tf_loop and torchrec (min(vocab, buckets)).",
    lower_bound=1,
)
_SMALL = flags.DEFINE_integer(
    "small_buckets", 2**16, "Rows per feature cap of torchrec_small.", lower_bound=1
)
_EVICT_EVERY = flags.DEFINE_integer(
    "evict_every", 20, "npu_rec: steps between evictions.", lower_bound=1
)
_RUNS = flags.DEFINE_list(
    "runs",
    ["npu_rec", "npu_rec_stock", "keras", "torchrec", "torchrec_small", "tf_loop", "mlp_only"],
    "Which runs.",
)
_OUT = flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "keras_bench.json"),
    "JSON output path.",
)

DIM, NUM_CAT, NUM_DENSE, LR = 16, 26, 13, 0.05
# Criteo's per-feature cardinalities (Kaggle display-ads), used as proportions.
CRITEO = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)


def make_batches():
    """`--distinct_batches` batches of (dense [b,13] f32, ids [b,26] i64, label [b,1] f32)."""
    from npu_rec.data import SyntheticCriteo

    total = sum(CRITEO)
    vocab = tuple(max(1, round(c * _IDS.value / total)) for c in CRITEO)
    gen = SyntheticCriteo(seed=11, vocab_sizes=vocab, alpha=1.05)
    rows = gen.rows(0, _BATCH.value * _BATCHES.value)
    dense = np.log1p(np.stack([rows[f"I{i}"] for i in range(1, 14)], 1)).astype("float32")
    cats = np.stack([rows[f"C{i}"] for i in range(1, 27)], 1)
    y = rows["label"].astype("float32")[:, None]
    b = _BATCH.value
    return [
        (dense[i * b : (i + 1) * b], cats[i * b : (i + 1) * b], y[i * b : (i + 1) * b])
        for i in range(_BATCHES.value)
    ], vocab


def mlp(x_dense, embs):
    """Bottom MLP 13-64-16, concat with 26 embeddings (432), top MLP 256-128-1."""
    h = keras.layers.Dense(64, "relu")(x_dense)
    h = keras.layers.Dense(DIM, "relu")(h)
    z = keras.layers.Concatenate()([h, *embs])
    z = keras.layers.Dense(256, "relu")(z)
    z = keras.layers.Dense(128, "relu")(z)
    return keras.layers.Dense(1, activation="sigmoid")(z)


def cycled(x, y):
    """A dataset cycling stacked in-memory batches (no Python in the input pipeline)."""
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().prefetch(2)


class _StepClock(keras.callbacks.Callback):
    """Seconds from the first batch's start to the last batch's end (after the other
    callbacks of that batch, e.g. an eviction), i.e. `fit` without its per-call setup
    and teardown (creating and deleting the data iterator: 0-1.2 s per call measured
    here, for every Keras model alike, and not a per-step cost)."""

    def on_train_begin(self, logs=None):
        self.start = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds = time.perf_counter() - self.start


def fit_runner(model, ds, callbacks=()):
    """`train(k)`: `model.fit` for k steps (the same for every Keras run); returns the
    seconds the k steps took (see `_StepClock`)."""
    clock = _StepClock()

    def train(k):
        model.fit(
            ds, epochs=1, steps_per_epoch=k, verbose=0, shuffle=False, callbacks=[*callbacks, clock]
        )
        return clock.seconds

    return train


def run_npu_rec(batches, vocab, admission=True, one_table=False, prefix=""):
    import npu_rec
    from npu_rec.keras import RecModel, SparseEmbedding
    from npu_rec.keras.callbacks import Evict

    npu_rec.init(use_dynamic_expansion=True, bind_cpu=False)
    dense = keras.Input((NUM_DENSE,), name="numeric")
    cats = keras.Input((NUM_CAT,), dtype="int64", name="cats")
    opt = npu_rec.optimizers.Adagrad(LR)
    policy = (
        dict(access_threshold=1, eviction_threshold=24 * 3600)
        if admission
        else dict(access_threshold=-1, eviction_threshold=-1)
    )
    if one_table:  # the ids of different features are distinct in this data
        emb = SparseEmbedding(
            "all_C", DIM, optimizer=opt, capacity=sum(min(v, 1 << 20) for v in vocab), **policy
        )(cats)
        embs = [keras.layers.Reshape((NUM_CAT * DIM,))(emb)]
    else:
        prefix = prefix or ("" if admission else "plain_")
        embs = [
            SparseEmbedding(
                f"{prefix}C{i + 1}", DIM, optimizer=opt, capacity=min(v, 1 << 20), **policy
            )(cats[:, i])
            for i, v in enumerate(vocab)
        ]
    model = RecModel({"numeric": dense, "cats": cats}, mlp(dense, embs))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    ds = cycled(
        {"numeric": np.stack([b[0] for b in batches]), "cats": np.stack([b[1] for b in batches])},
        np.stack([b[2] for b in batches]),
    )
    evict = Evict(evict_time_interval=None, evict_step_interval=_EVICT_EVERY.value)
    fit = fit_runner(model, ds, [evict] if admission else [])

    def train(k):
        seconds = fit(k)
        if not getattr(train, "warm", False):  # compile the callback's eviction, untimed
            evict.evict()
            train.warm = True
        return seconds

    return train


def run_npu_rec_stock(batches, vocab):
    """npu_rec on the stock TensorFlow ops (NPU_REC_KERNELS=off while its model is built
    and traced): the same model and tables as `npu_rec`, without the compiled kernels."""
    from npu_rec._kernels import _build

    with _build.forced(False):
        train = run_npu_rec(batches, vocab, prefix="stock_")
        train(_WARMUP.value)  # traced (and so fixed to the stock path) here
    return train


def run_npu_rec_plain(batches, vocab):
    """npu_rec without admission and eviction (not a default run: the cost of both)."""
    return run_npu_rec(batches, vocab, admission=False)


def run_npu_rec_one_table(batches, vocab):
    """npu_rec with one table for all 26 features, i.e. table batching (not a default
    run): one unique, index probe, gather and optimizer step for the whole batch."""
    return run_npu_rec(batches, vocab, one_table=True)


def run_keras(batches, vocab):
    dense = keras.Input((NUM_DENSE,), name="numeric")
    cats = keras.Input((NUM_CAT,), dtype="int64", name="cats")
    embs = []
    for i in range(NUM_CAT):
        h = keras.layers.Hashing(_BUCKETS.value)(cats[:, i])
        embs.append(keras.layers.Embedding(_BUCKETS.value, DIM)(h))
    model = keras.Model({"numeric": dense, "cats": cats}, mlp(dense, embs))
    model.compile(
        optimizer=keras.optimizers.Adagrad(LR), loss="binary_crossentropy", jit_compile=False
    )
    ds = cycled(
        {"numeric": np.stack([b[0] for b in batches]), "cats": np.stack([b[1] for b in batches])},
        np.stack([b[2] for b in batches]),
    )
    return fit_runner(model, ds)


def run_mlp_only(batches, vocab):
    """The same MLP, loss and optimizer, fed random embeddings as 26 [b, 16] inputs."""
    dense = keras.Input((NUM_DENSE,), name="numeric")
    embs = [keras.Input((DIM,), name=f"e{i}") for i in range(NUM_CAT)]
    model = keras.Model(
        {"numeric": dense, **{f"e{i}": e for i, e in enumerate(embs)}}, mlp(dense, embs)
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", jit_compile=False)
    rng = np.random.default_rng(0)
    x = {"numeric": np.stack([b[0] for b in batches])}
    for i in range(NUM_CAT):
        x[f"e{i}"] = rng.uniform(-0.05, 0.05, (len(batches), _BATCH.value, DIM)).astype("float32")
    return fit_runner(model, cycled(x, np.stack([b[2] for b in batches])))


def _table_rows(vocab, cap=None):
    return [min(v, cap or _BUCKETS.value) for v in vocab]


def run_tf_loop(batches, vocab):
    sizes = _table_rows(vocab)
    tables = [tf.Variable(tf.random.uniform([n, DIM], -0.05, 0.05)) for n in sizes]
    accums = [tf.Variable(tf.fill([n, DIM], 0.1)) for n in sizes]
    dense = keras.Input((NUM_DENSE,))
    embs = [keras.Input((DIM,)) for _ in range(NUM_CAT)]
    net = keras.Model([dense, *embs], mlp(dense, embs))
    dense_opt = keras.optimizers.Adam()
    dense_opt.build(net.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy()
    mods = tf.constant(sizes, tf.int64)

    @tf.function(reduce_retracing=True)
    def step(d, c, y):
        rows = tf.math.floormod(c, mods)
        uniqs = [tf.unique(rows[:, i]) for i in range(NUM_CAT)]
        with tf.GradientTape() as tape:
            gathered = [tf.gather(t, u.y) for t, u in zip(tables, uniqs, strict=True)]
            tape.watch(gathered)
            embs = [tf.gather(g, u.idx) for g, u in zip(gathered, uniqs, strict=True)]
            loss = loss_fn(y, net([d, *embs], training=True))
        grads = tape.gradient(loss, net.trainable_variables + gathered)
        dense_opt.apply(grads[: len(net.trainable_variables)], net.trainable_variables)
        for i, g in enumerate(grads[len(net.trainable_variables) :]):
            g = tf.convert_to_tensor(g)
            acc = tf.gather(accums[i], uniqs[i].y) + g * g
            accums[i].scatter_update(tf.IndexedSlices(acc, uniqs[i].y))
            tables[i].scatter_sub(tf.IndexedSlices(LR * g / tf.sqrt(acc), uniqs[i].y))
        return loss

    state = {"s": 0}

    def train(k):
        for _ in range(k):
            d, c, y = batches[state["s"] % len(batches)]
            state["s"] += 1
            loss = step(d, c, y)
        float(loss)  # wait for the last step

    return train


def run_torchrec(batches, vocab, cap=None):
    """TorchRec in a worker process (benchmarks/torchrec_worker.py), driven block by block."""
    import atexit
    import subprocess
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="keras_bench_"), "batches.npz")
    np.savez(
        path,
        dense=np.stack([b[0] for b in batches]),
        cats=np.stack([b[1] for b in batches]),
        label=np.stack([b[2] for b in batches]),
    )
    sizes = ",".join(str(n) for n in _table_rows(vocab, cap))
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrec_worker.py")
    proc = subprocess.Popen(
        [sys.executable, worker, path, sizes, str(LR)],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    atexit.register(proc.kill)
    first = proc.stdout.readline().strip()
    if first != "ready":
        proc.kill()
        return first or f"failed: the TorchRec worker exited with code {proc.wait()}"

    def train(k):
        proc.stdin.write(f"{k}\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"the TorchRec worker exited with code {proc.wait()}")

    return train


def run_torchrec_small(batches, vocab):
    """TorchRec with at most --small_buckets rows per table (more collisions, faster
    backward: FBGEMM's CPU backward time grows with the rows of the tables)."""
    return run_torchrec(batches, vocab, cap=_SMALL.value)


RUNNERS = {
    "npu_rec": run_npu_rec,
    "npu_rec_stock": run_npu_rec_stock,
    "npu_rec_plain": run_npu_rec_plain,
    "npu_rec_one_table": run_npu_rec_one_table,
    "keras": run_keras,
    "torchrec": run_torchrec,
    "torchrec_small": run_torchrec_small,
    "tf_loop": run_tf_loop,
    "mlp_only": run_mlp_only,
}


def main(argv):
    del argv
    unknown = sorted(set(_RUNS.value) - set(RUNNERS))
    if unknown:
        raise app.UsageError(f"--runs must name runs of {sorted(RUNNERS)}. Received: {unknown}")
    batches, vocab = make_batches()
    results, trainers = {}, {}
    for name in _RUNS.value:
        try:
            trainer = RUNNERS[name](batches, vocab)
            if isinstance(trainer, str):
                results[name] = trainer
                continue
            trainer(_WARMUP.value)
            trainers[name] = trainer
        except Exception as error:  # report and go on with the next run
            results[name] = f"failed: {type(error).__name__}: {error}"[:300]
    rates = {name: [] for name in trainers}
    samples = _STEPS.value * _BATCH.value
    for _ in range(_ROUNDS.value):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            seconds = trainer(_STEPS.value)  # Keras runs time their own steps
            rates[name].append(samples / (seconds or time.perf_counter() - start))
    for name in _RUNS.value:
        if name in rates:
            results[name] = statistics.median(rates[name])
    print(f"{'run':<17} {'samples/s':>12}   blocks")
    for name, value in results.items():
        if isinstance(value, float):
            blocks = ", ".join(f"{r:,.0f}" for r in rates[name])
            print(f"{name:<17} {value:>12,.0f}   [{blocks}]")
        else:
            print(f"{name:<17} {value}")
    # Ratios of the median rates, and per round (blocks of one round ran back to back,
    # so a per-round ratio cancels slow drifts in the machine's speed).
    ratios, round_ratios = {}, {}
    targets = {"npu_rec / torchrec": 1.6, "npu_rec / mlp_only": 0.8, "npu_rec / npu_rec_stock": 1.4}
    pairs = [
        ("npu_rec", o)
        for o in (
            "torchrec",
            "torchrec_small",
            "mlp_only",
            "tf_loop",
            "keras",
            "npu_rec_one_table",
            "npu_rec_stock",
        )
    ]
    for mine, other in pairs:
        if mine in rates and other in rates:
            key = f"{mine} / {other}"
            ratios[key] = results[mine] / results[other]
            round_ratios[key] = [a / b for a, b in zip(rates[mine], rates[other], strict=True)]
    for k, v in ratios.items():
        target = f"  (target >= {targets[k]})" if k in targets else ""
        per_round = round_ratios[k]
        print(
            f"{k}: {v:.2f}{target}   per round: median {statistics.median(per_round):.2f}, "
            f"{min(per_round):.2f}-{max(per_round):.2f}"
        )
    out = {
        "results": results,
        "block_rates": rates,
        "ratios": ratios,
        "round_ratios": round_ratios,
        "targets": targets,
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
        },
        "flags": {
            f: flags.FLAGS[f].value
            for f in (
                "batch_size",
                "steps",
                "rounds",
                "warmup",
                "distinct_batches",
                "distinct_ids",
                "hash_buckets",
                "small_buckets",
                "evict_every",
            )
        },
    }
    with open(_OUT.value, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    app.run(main)
