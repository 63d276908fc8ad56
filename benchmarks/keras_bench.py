"""DLRM-style training throughput: npu_rec RecModel.fit against the alternatives.

All runs train the same DLRM-style model on the same pre-generated batches:
26 categorical features of raw int64 ids (Zipf alpha 1.05 over about
`--distinct_ids` ids split across the features like Criteo's), 13 dense
features, embedding dim 16, bottom MLP 13-64-16, top MLP 432-256-128-1,
Adagrad on the embeddings (Adam on the dense part).

  npu_rec     RecModel.fit, SparseEmbedding tables with admission and eviction on
  keras       plain Keras 3: Hashing(--hash_buckets) + Embedding, Adagrad
  torchrec    EmbeddingBagCollection + fused row-wise Adagrad (only if installed)
  tf_loop     hand-written tf.function loop: fixed tf.Variable tables, sparse Adagrad
  mlp_only    the dense MLP alone on fixed embedding inputs (the upper limit)

Prints a table and writes JSON. Example (quick):
  python benchmarks/keras_bench.py --steps 10 --distinct_ids 1000000 --out /tmp/kb.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

_BATCH = flags.DEFINE_integer("batch_size", 4096, "Samples per step.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per run.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps (tracing) per run.", lower_bound=1)
_BATCHES = flags.DEFINE_integer("distinct_batches", 8, "Pre-generated batches, cycled.",
                                lower_bound=1)
_IDS = flags.DEFINE_integer("distinct_ids", 10_000_000, "Distinct ids over all features.",
                            lower_bound=26)
_BUCKETS = flags.DEFINE_integer("hash_buckets", 2**20, "Rows per feature: keras, tf_loop.",
                                lower_bound=1)
_RUNS = flags.DEFINE_list("runs", ["npu_rec", "keras", "torchrec", "tf_loop", "mlp_only"],
                          "Which runs.")
_OUT = flags.DEFINE_string("out", "keras_bench.json", "JSON output path.")

DIM, NUM_CAT, NUM_DENSE = 16, 26, 13
# Criteo's per-feature cardinalities (Kaggle display-ads), used as proportions.
CRITEO = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
          27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)


def make_batches():
    from npu_rec.data import SyntheticCriteo

    total = sum(CRITEO)
    vocab = tuple(max(1, round(c * _IDS.value / total)) for c in CRITEO)
    gen = SyntheticCriteo(seed=11, vocab_sizes=vocab, alpha=1.05)
    rows = gen.rows(0, _BATCH.value * _BATCHES.value)
    dense = np.log1p(np.stack([rows[f"I{i}"] for i in range(1, 14)], 1)).astype("float32")
    cats = np.stack([rows[f"C{i}"] for i in range(1, 27)], 1)
    y = rows["label"].astype("float32")[:, None]
    b = _BATCH.value
    return [(dense[i * b:(i + 1) * b], cats[i * b:(i + 1) * b], y[i * b:(i + 1) * b])
            for i in range(_BATCHES.value)], vocab


def mlp(x_dense, embs):
    """Bottom MLP 13-64-16, concat with 26 embeddings (432), top MLP 256-128-1."""
    h = keras.layers.Dense(64, "relu")(x_dense)
    h = keras.layers.Dense(DIM, "relu")(h)
    z = keras.layers.Concatenate()([h, *embs])
    z = keras.layers.Dense(256, "relu")(z)
    z = keras.layers.Dense(128, "relu")(z)
    return keras.layers.Dense(1, activation="sigmoid")(z)


def dataset(batches):
    """The pre-generated batches, cycled from memory (no Python in the input pipeline)."""
    d = np.stack([b[0] for b in batches])
    c = np.stack([b[1] for b in batches])
    y = np.stack([b[2] for b in batches])
    return tf.data.Dataset.from_tensor_slices(({"numeric": d, "cats": c}, y)).repeat().prefetch(2)


def time_fit(model, batches):
    ds = dataset(batches)
    model.fit(ds, epochs=1, steps_per_epoch=_WARMUP.value, verbose=0)
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
    return _STEPS.value * _BATCH.value / (time.perf_counter() - start)


def run_npu_rec(batches, vocab):
    import npu_rec
    from npu_rec.keras import RecModel, SparseEmbedding
    from npu_rec.keras.callbacks import Evict

    npu_rec.init(use_dynamic_expansion=True, bind_cpu=False)
    dense = keras.Input((NUM_DENSE,), name="numeric")
    cats = keras.Input((NUM_CAT,), dtype="int64", name="cats")
    opt = npu_rec.optimizers.Adagrad(0.05)
    embs = [SparseEmbedding(f"C{i + 1}", DIM, optimizer=opt, access_threshold=1,
                            eviction_threshold=24 * 3600, capacity=min(v, 1 << 20))(cats[:, i])
            for i, v in enumerate(vocab)]
    model = RecModel({"numeric": dense, "cats": cats}, mlp(dense, embs))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    evict = Evict(evict_time_interval=None, evict_step_interval=1000)
    model.fit = _with_callbacks(model.fit, [evict])
    return time_fit(model, batches)


def _with_callbacks(fit, callbacks):
    return lambda *a, **k: fit(*a, callbacks=callbacks, **k)


def run_keras(batches, vocab):
    dense = keras.Input((NUM_DENSE,), name="numeric")
    cats = keras.Input((NUM_CAT,), dtype="int64", name="cats")
    embs = []
    for i in range(NUM_CAT):
        h = keras.layers.Hashing(_BUCKETS.value)(cats[:, i])
        embs.append(keras.layers.Embedding(_BUCKETS.value, DIM)(h))
    model = keras.Model({"numeric": dense, "cats": cats}, mlp(dense, embs))
    model.compile(optimizer=keras.optimizers.Adagrad(0.05), loss="binary_crossentropy",
                  jit_compile=False)
    return time_fit(model, batches)


def run_tf_loop(batches, vocab):
    n = _BUCKETS.value
    tables = [tf.Variable(tf.random.uniform([n, DIM], -0.05, 0.05)) for _ in range(NUM_CAT)]
    accums = [tf.Variable(tf.fill([n, DIM], 0.1)) for _ in range(NUM_CAT)]
    dense = keras.Input((NUM_DENSE,))
    embs = [keras.Input((DIM,)) for _ in range(NUM_CAT)]
    net = keras.Model([dense, *embs], mlp(dense, embs))
    dense_opt = keras.optimizers.Adam()
    dense_opt.build(net.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy()

    @tf.function
    def step(d, c, y):
        rows = tf.math.floormod(c, n)
        with tf.GradientTape() as tape:
            gathered = [tf.gather(t, rows[:, i]) for i, t in enumerate(tables)]
            tape.watch(gathered)
            loss = loss_fn(y, net([d, *gathered], training=True))
        grads = tape.gradient(loss, net.trainable_variables + gathered)
        dense_opt.apply(grads[:len(net.trainable_variables)], net.trainable_variables)
        for i, g in enumerate(grads[len(net.trainable_variables):]):
            uniq, idx = tf.unique(rows[:, i])
            g = tf.math.unsorted_segment_sum(g, idx, tf.size(uniq))
            acc = tf.gather(accums[i], uniq) + g * g
            accums[i].scatter_update(tf.IndexedSlices(acc, uniq))
            tables[i].scatter_sub(tf.IndexedSlices(0.05 * g / tf.sqrt(acc), uniq))
        return loss

    def go(k):
        for s in range(k):
            d, c, y = batches[s % len(batches)]
            step(d, c, y)
    go(_WARMUP.value)
    start = time.perf_counter()
    go(_STEPS.value)
    return _STEPS.value * _BATCH.value / (time.perf_counter() - start)


def run_mlp_only(batches, vocab):
    dense = keras.Input((NUM_DENSE,), name="numeric")
    embs_in = keras.Input((NUM_CAT * DIM,), name="embs")
    embs = [embs_in[:, i * DIM:(i + 1) * DIM] for i in range(NUM_CAT)]
    model = keras.Model({"numeric": dense, "embs": embs_in}, mlp(dense, embs))
    model.compile(optimizer="adam", loss="binary_crossentropy", jit_compile=False)
    fixed = np.random.default_rng(0).uniform(-0.05, 0.05, (_BATCH.value, NUM_CAT * DIM))
    d = np.stack([b[0] for b in batches])
    y = np.stack([b[2] for b in batches])
    e = np.broadcast_to(fixed.astype("float32"), (len(batches), *fixed.shape))
    ds = tf.data.Dataset.from_tensor_slices(({"numeric": d, "embs": e}, y)).repeat().prefetch(2)
    model.fit(ds, epochs=1, steps_per_epoch=_WARMUP.value, verbose=0)
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
    return _STEPS.value * _BATCH.value / (time.perf_counter() - start)


def run_torchrec(batches, vocab):
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except ImportError as error:
        return f"skipped: {error.name} is not installed (optional benchmark extra)"
    return "skipped: TorchRec is installed but this script has no TorchRec runner yet"


RUNNERS = {"npu_rec": run_npu_rec, "keras": run_keras, "torchrec": run_torchrec,
           "tf_loop": run_tf_loop, "mlp_only": run_mlp_only}


def main(argv):
    del argv
    batches, vocab = make_batches()
    results = {}
    for name in _RUNS.value:
        keras.backend.clear_session()
        try:
            results[name] = RUNNERS[name](batches, vocab)
        except Exception as error:  # noqa: BLE001 - report and go on with the next run
            results[name] = f"failed: {type(error).__name__}: {error}"[:300]
    print(f"{'run':<10} {'samples/s':>12}")
    for name, value in results.items():
        print(f"{name:<10} {value:>12,.0f}" if isinstance(value, float) else f"{name:<10} {value}")
    mlp_rate, npu_rate = results.get("mlp_only"), results.get("npu_rec")
    ratios = {}
    if isinstance(mlp_rate, float) and isinstance(npu_rate, float):
        ratios["npu_rec / mlp_only"] = npu_rate / mlp_rate
    if isinstance(results.get("torchrec"), float) and isinstance(npu_rate, float):
        ratios["npu_rec / torchrec"] = npu_rate / results["torchrec"]
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    out = {"results": results, "ratios": ratios, "command": " ".join(sys.argv),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "tensorflow": tf.__version__, "keras": keras.__version__},
           "flags": {f: flags.FLAGS[f].value for f in ("batch_size", "steps", "warmup",
                                                     "distinct_batches", "distinct_ids",
                                                     "hash_buckets")}}
    with open(_OUT.value, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    app.run(main)
