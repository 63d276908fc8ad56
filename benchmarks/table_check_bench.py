"""Cost of the invariant check every table save runs (`npu_rec.table._check`).

Fills one table (Adagrad, so one slot) with `--keys` live keys, then times,
alternating, the read of its whole state for a save without and with the
check, in eager mode and in a tf.compat.v1 graph (one session run). The
check's cost is the difference. Prints a table and writes JSON.

Usage:
  python benchmarks/table_check_bench.py                       # 1M keys, dim 16
  python benchmarks/table_check_bench.py --keys=100000 --rounds=3
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import tensorflow as tf
from absl import app, flags

import npu_rec

_KEYS = flags.DEFINE_integer("keys", 1_000_000, "Live keys in the table.", lower_bound=1000)
_DIM = flags.DEFINE_integer("dim", 16, "Embedding width.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed reads of each kind.", lower_bound=1)
_JSON = flags.DEFINE_string(
    "json",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "table_check_bench.json"),
    "Where to write.",
)
_BATCH = 100_000


def _fill(table, run):
    keys = np.unique(np.random.default_rng(0).integers(-(2**62), 2**62, _KEYS.value * 2))
    keys = np.random.default_rng(1).permutation(keys)[: _KEYS.value]
    for i in range(0, len(keys), _BATCH):
        run(keys[i : i + _BATCH])


def _time(read, rounds):
    out = {False: [], True: []}
    for _ in range(rounds):
        for check in (False, True):
            t0 = time.perf_counter()
            read(check)
            out[check].append(time.perf_counter() - t0)
    return {"read_s": float(np.median(out[False])), "read_and_check_s": float(np.median(out[True]))}


def _eager():
    table = npu_rec.create_table(
        "bench_eager", _DIM.value, capacity=_KEYS.value, optimizer=npu_rec.optimizers.Adagrad(0.1)
    )
    _fill(table, lambda k: npu_rec.sparse_lookup(table, tf.constant(k)))
    return _time(lambda check: table.read_state(0, check=check), _ROUNDS.value)


def _graph():
    with tf.Graph().as_default():
        table = npu_rec.create_table(
            "bench_graph",
            _DIM.value,
            capacity=_KEYS.value,
            optimizer=npu_rec.optimizers.Adagrad(0.1),
        )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = npu_rec.sparse_lookup(table, ids)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _fill(table, lambda k: sess.run(emb, {ids: k}))
            return _time(lambda check: table.read_state(0, sess, check=check), _ROUNDS.value)


def main(argv):
    del argv
    results = {}
    for mode, fn in (("eager", _eager), ("graph", _graph)):
        npu_rec.table._registry.clear()
        r = fn()
        r["check_s"] = r["read_and_check_s"] - r["read_s"]
        results[mode] = r
    print(f"{_KEYS.value} keys, dim {_DIM.value}, Adagrad; median of {_ROUNDS.value} rounds")
    print(f"{'mode':8} {'read (s)':>10} {'read+check (s)':>15} {'check (s)':>10}")
    for mode, r in results.items():
        print(f"{mode:8} {r['read_s']:10.3f} {r['read_and_check_s']:15.3f} {r['check_s']:10.3f}")
    with open(_JSON.value, "w") as f:
        json.dump(
            {
                "keys": _KEYS.value,
                "dim": _DIM.value,
                "rounds": _ROUNDS.value,
                "tensorflow": tf.__version__,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "results": results,
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    app.run(main)
