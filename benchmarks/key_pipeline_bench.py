"""Steps/s of table training with and without the key pipeline (`npu_rec.prepare_keys`).

A tf.data pipeline yields Zipf batches of `--fields` id features (each
`--batch` x 1 ids, one table per feature, dim 16, Adagrad, admission on);
the training step is a `tf.function` that looks up every feature, computes a
loss and applies the recorded gradients. Variant `plain` deduplicates the ids
inside the step (`tf.unique_with_counts` per feature); variant `prepared`
maps `npu_rec.prepare_keys` over the batches before `prefetch`, so the
unique runs on tf.data's threads while the previous step trains. The two are
timed in alternating blocks (a shared machine's load hits both alike).

Usage:
  python benchmarks/key_pipeline_bench.py --steps=60
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_STEPS = flags.DEFINE_integer("steps", 60, "Timed steps per variant.", lower_bound=1)
_BLOCK = flags.DEFINE_integer("block", 10, "Steps per alternating block.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", 4096, "Examples per batch.", lower_bound=1)
_FIELDS = flags.DEFINE_integer("fields", 26, "Id features (one table each).", lower_bound=1)
_KEYS = flags.DEFINE_integer("keys", 100000, "Distinct ids per feature.", lower_bound=1)
_THREADS = flags.DEFINE_integer("threads", 2, "TF intra/inter-op threads.", lower_bound=1)
_JSON = flags.DEFINE_string(
    "json",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "key_pipeline_bench.json"),
    "Output file.",
)


def main(argv):
    del argv
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    import npu_rec

    names = [f"C{i}" for i in range(_FIELDS.value)]
    rng = np.random.default_rng(0)
    pool = [
        {
            n: ((rng.zipf(1.2, size=_BATCH.value) - 1) % _KEYS.value).astype(np.int64) * 7919 + i
            for i, n in enumerate(names)
        }
        for _ in range(8)
    ]
    tables = {
        n: npu_rec.create_table(
            n,
            16,
            optimizer=npu_rec.optimizers.Adagrad(0.05),
            access_threshold=1,
            dynamic_expansion=True,
            capacity=_KEYS.value,
        )
        for n in names
    }

    def dataset(prepare):
        ds = tf.data.Dataset.from_tensor_slices(
            {n: np.stack([b[n] for b in pool]) for n in names}
        ).repeat()
        if prepare:
            ds = npu_rec.prepare_keys(ds, names)
        return iter(ds.prefetch(2))

    @tf.function
    def step(iterator):
        # The batch is taken inside the function, as Keras' fit does: no retracing
        # on the dynamic shapes of the unique keys.
        feats = next(iterator)
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            loss = tf.add_n(
                [
                    tf.reduce_sum(tf.square(npu_rec.sparse_lookup(tables[n], feats[n])))
                    for n in names
                ]
            )
        npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
        return loss

    iters = {"plain": dataset(False), "prepared": dataset(True)}
    for it in iters.values():  # trace and fill the tables
        for _ in range(8):
            step(it).numpy()
    spent = dict.fromkeys(iters, 0.0)
    for _ in range(0, _STEPS.value, _BLOCK.value):
        for name, it in iters.items():
            start = time.perf_counter()
            for _ in range(_BLOCK.value):
                loss = step(it)
            loss.numpy()
            spent[name] += time.perf_counter() - start
    steps = (_STEPS.value + _BLOCK.value - 1) // _BLOCK.value * _BLOCK.value
    res = {k: steps / v for k, v in spent.items()}
    res["speedup"] = res["prepared"] / res["plain"]
    print(f"{'variant':>10} {'steps/s':>9}")
    for k in ("plain", "prepared"):
        print(f"{k:>10} {res[k]:>9.2f}")
    print(f"prepared / plain: {res['speedup']:.2f}")
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
        },
        "command": " ".join(sys.argv),
        "batch": _BATCH.value,
        "fields": _FIELDS.value,
        "keys": _KEYS.value,
        "steps": steps,
        "steps_per_s": res,
    }
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    app.run(main)
