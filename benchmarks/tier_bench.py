"""Tiered table (memory + disk) against the same table all in memory, in one run.

Both tables get the same live keys by a bulk import of generated rows
(`write_state`: rows, Adagrad accumulators, counts), then train on the same
Zipf-distributed batches of `--batch` x `--fields` raw int64 ids (lookup +
Adagrad update, one `tf.function` step), timed in alternating blocks of 5
steps so that other load on a shared machine hits both alike. The tiered
table keeps `--memory_fraction` of the keys in memory and the rest in
segment files under `--ssd_path`.

Reported per table: steps/s, and for the tiered one its ratio to the
in-memory table, the hit rate of the timed steps (unique keys found in
memory), promotions, demotions and bytes read/written per step, disk bytes
per cold key, and the process RSS growth while the table was made and filled.

Usage:
  python benchmarks/tier_bench.py                          # 1M keys, 20% in memory
  python benchmarks/tier_bench.py --keys=5000000 --steps=30
"""

from __future__ import annotations

import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
from _table_ids import raw_keys, rss, zipf_ranks
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_KEYS = flags.DEFINE_integer("keys", 1_000_000, "Live keys of each table.", lower_bound=1000)
_FRACTION = flags.DEFINE_float("memory_fraction", 0.2, "memory_rows / keys of the tiered table.")
_DIM = flags.DEFINE_integer("dim", 16, "Embedding width.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per table.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 10, "Untimed steps first (the hot set settles).")
_BATCH = flags.DEFINE_integer("batch", 4096, "Examples per batch.", lower_bound=1)
_FIELDS = flags.DEFINE_integer("fields", 26, "Ids per example.", lower_bound=1)
_ZIPF = flags.DEFINE_float("zipf_a", 1.05, "Zipf exponent of the id distribution.")
_SSD = flags.DEFINE_string("ssd_path", None, "Directory of the disk tier (default: a temp dir).")
_THREADS = flags.DEFINE_integer("threads", 2, "TF intra/inter-op threads.", lower_bound=1)
_JSON = flags.DEFINE_string(
    "json",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tier_bench.json"),
    "Where the results go.",
)


def _zipf_ranks(rng, n_keys, count):
    return zipf_ranks(rng, _ZIPF.value, n_keys, count)


def _make_table(tf, npu_rec, name, tiered, ssd):
    n = _KEYS.value
    kwargs = {}
    if tiered:
        kwargs = {"memory_rows": max(1, int(n * _FRACTION.value)), "ssd_path": ssd}
    rss0 = rss()
    table = npu_rec.create_table(
        name,
        _DIM.value,
        optimizer=npu_rec.optimizers.Adagrad(0.05),
        capacity=n + n // 8 + 1024,
        dynamic_expansion=True,
        access_threshold=0,
        **kwargs,
    )
    rng = np.random.default_rng(1)
    keys = raw_keys(np.arange(n))
    state = {
        "keys": keys,
        "values": rng.uniform(-0.05, 0.05, (n, _DIM.value)).astype(np.float32),
        "slot/accumulator": np.full((n, _DIM.value), 0.1, np.float32),
        "counts": np.ones(n, np.int64),
        "last_seen": np.zeros(n, np.int64),
        "pending_keys": np.zeros(0, np.int64),
        "pending_counts": np.zeros(0, np.int64),
        "pending_last_seen": np.zeros(0, np.int64),
        "max_seen": np.int64(0),
        "ts_feature": np.bool_(False),
        "opt_step": np.int64(0),
    }
    t0 = time.perf_counter()
    table.write_state(state)
    fill_s = time.perf_counter() - t0
    del state, keys
    gc.collect()
    return table, fill_s, rss() - rss0


def _interleaved(cases, batches, steps, warmup, block=5):
    for fn in cases.values():
        for i in range(warmup):
            fn(*batches[i % len(batches)])
    spent = dict.fromkeys(cases, 0.0)
    for first in range(0, steps, block):
        for name, fn in cases.items():
            start = time.perf_counter()
            for i in range(first, min(steps, first + block)):
                out = fn(*batches[i % len(batches)])
            out.numpy()
            spent[name] += time.perf_counter() - start
    return spent


def main(argv):
    del argv
    import tensorflow as tf

    import npu_rec

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    ssd = _SSD.value or tempfile.mkdtemp(prefix="tier_bench_")
    n = _KEYS.value
    rng = np.random.default_rng(0)
    ids_per_batch = _BATCH.value * _FIELDS.value
    batches = [
        (
            tf.constant(
                raw_keys(_zipf_ranks(rng, n, ids_per_batch)).reshape(_BATCH.value, _FIELDS.value)
            ),
        )
        for _ in range(16)
    ]
    tables, fill, rss = {}, {}, {}
    for name, tiered in (("memory", False), ("tiered", True)):
        tables[name], fill[name], rss[name] = _make_table(tf, npu_rec, name, tiered, ssd)

    def step_fn(table):
        @tf.function
        def train_step(ids):
            with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
                loss = tf.reduce_sum(tf.square(npu_rec.sparse_lookup(table, ids)))
            grads = tape.gradient(loss, [r.embeddings for r in recs])
            npu_rec.apply_recorded_gradients(recs, grads)
            return loss

        return train_step

    cases = {name: step_fn(t) for name, t in tables.items()}
    for fn in cases.values():  # warm-up: trace, and let the hot set settle
        for i in range(_WARMUP.value):
            fn(*batches[i % len(batches)])
    before = tables["tiered"].tier_stats()
    spent = _interleaved(cases, batches, _STEPS.value, 0)
    after = tables["tiered"].tier_stats()
    steps = _STEPS.value
    d = {k: after[k] - before[k] for k in before if isinstance(before[k], int)}
    results = []
    for name, table in tables.items():
        r = {
            "table": name,
            "keys": n,
            "memory_rows": table.config.memory_rows or n,
            "steps_per_s": steps / spent[name],
            "fill_s": fill[name],
            "rss_growth_gib": rss[name] / 2**30,
            "size": int(table.size()),
        }
        if name == "tiered":
            r.update(
                {
                    "ratio_to_memory": spent["memory"] / spent["tiered"],
                    "hit_rate": d["hits"] / max(d["lookups"], 1),
                    "promotions_per_step": d["promotions"] / steps,
                    "demotions_per_step": d["demotions"] / steps,
                    "mb_read_per_step": d["bytes_read"] / steps / 1e6,
                    "mb_written_per_step": d["bytes_written"] / steps / 1e6,
                    "compactions": after["compactions"],
                    "cold_keys": after["cold_keys"],
                    "disk_bytes_per_cold_key": after["disk_bytes_per_key"],
                }
            )
        results.append(r)
    print(
        f"{n} keys, dim {_DIM.value}, batch {_BATCH.value} x {_FIELDS.value}, "
        f"Zipf {_ZIPF.value}, {steps} timed steps"
    )
    print(
        f"{'table':8} {'mem rows':>10} {'steps/s':>8} {'ratio':>6} {'hit':>6} "
        f"{'prom/st':>8} {'MB r/w per step':>16} {'RSS GiB':>8}"
    )
    for r in results:
        ratio = r.get("ratio_to_memory", 1.0)
        hit = r.get("hit_rate", 1.0)
        prom = r.get("promotions_per_step", 0.0)
        rw = f"{r.get('mb_read_per_step', 0):.1f}/{r.get('mb_written_per_step', 0):.1f}"
        print(
            f"{r['table']:8} {r['memory_rows']:>10} {r['steps_per_s']:>8.2f} {ratio:>6.2f} "
            f"{hit:>6.3f} {prom:>8.0f} {rw:>16} {r['rss_growth_gib']:>8.2f}"
        )
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
        "zipf_a": _ZIPF.value,
        "dim": _DIM.value,
        "steps": steps,
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
        json.dump(out, f, indent=2)
    for t in tables.values():
        for shard in t.shards:
            store = getattr(shard.state, "store", None)
            if store is not None:
                store.close()
    if _SSD.value is None:
        shutil.rmtree(ssd, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
