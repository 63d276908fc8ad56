"""Where an embedding training step spends its time, per kernel type.

Builds the sparse part of a DLRM-style training step (training lookups of
`--tables` features x `--batch_size` Zipf-distributed raw ids, a trivial loss,
the recorded gradients applied by Adagrad; admission at the first sighting)
in a `tf.compat.v1` graph, in two layouts:

  per_table  one table per feature, one lookup of [batch] ids each (the
             Keras benchmark's `npu_rec` run)
  one_table  one table for all features, one lookup of the [batch, tables]
             ids (table batching, `npu_rec_one_table`)

Each layout is built on the compiled table kernels and on the stock ops
(`--paths`; `kernels_dense` = the kernels probing a `DenseHashTable` key
index, as before the owned key map). For each it times `--steps` steps (wall clock, median of `--rounds` blocks,
the runs alternating)
and then traces `--trace_steps` steps with `RunMetadata` step stats: the
kernel time of each op type, summed over threads. Kernel time that exceeds
the wall time ran in parallel on the inter-op threads. Prints a table and
writes JSON.

Example:
  python benchmarks/step_trace.py --steps 20 --rounds 3
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import tensorflow as tf
from absl import app, flags

_TABLES = flags.DEFINE_integer("tables", 26, "Features (tables in `per_table`).", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Examples per step.", lower_bound=1)
_VOCAB = flags.DEFINE_integer(
    "vocab",
    400_000,
    "Distinct ids per feature (Zipf 1.05 ranks folded into this many).",
    lower_bound=1,
)
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per block.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed blocks per layout (alternating).", lower_bound=1)
_TRACE = flags.DEFINE_integer("trace_steps", 10, "Traced steps per layout.", lower_bound=1)
_TOP = flags.DEFINE_integer("top", 12, "Op types listed per layout.", lower_bound=1)
_LAYOUTS = flags.DEFINE_list("layouts", ["per_table", "one_table"], "Layouts to run.")
_PATHS = flags.DEFINE_list(
    "paths",
    ["kernels", "stock"],
    "Table op paths: `kernels` (compiled, when they load), `kernels_dense` (the "
    "kernels with TF's DenseHashTable as the key index instead of their own map) "
    "and/or `stock` (NPU_REC_KERNELS=off while the graph is built).",
)
_OUT = flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "step_trace.json"),
    "JSON output path.",
)

LAYOUTS = ("per_table", "one_table")
PATHS = ("kernels", "kernels_dense", "stock")


def build(layout: str):
    """(session, ids placeholder, train op) of one layout in its own graph."""
    import npu_rec

    graph = tf.Graph()
    with graph.as_default():
        opt = npu_rec.optimizers.Adagrad(0.05)
        kw = dict(optimizer=opt, access_threshold=1, eviction_threshold=86400)
        ids = tf.compat.v1.placeholder(tf.int64, [_BATCH.value, _TABLES.value])
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
            if layout == "per_table":
                embs = [
                    npu_rec.sparse_lookup(
                        npu_rec.create_table(f"{layout}{i}", 16, capacity=1 << 17, **kw), ids[:, i]
                    )
                    for i in range(_TABLES.value)
                ]
            else:
                table = npu_rec.create_table(layout, 16, capacity=_TABLES.value << 17, **kw)
                embs = [npu_rec.sparse_lookup(table, ids)]
            loss = tf.add_n([tf.reduce_sum(tf.square(e)) for e in embs])
        grads = tape.gradient(loss, [r.embeddings for r in records])
        train = tf.group(npu_rec.apply_recorded_gradients(records, grads), loss)
        init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
    threads = tf.config.threading
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads.get_intra_op_parallelism_threads(),
        inter_op_parallelism_threads=threads.get_inter_op_parallelism_threads(),
    )
    sess = tf.compat.v1.Session(graph=graph, config=config)
    sess.run(init)
    return sess, ids, train


def make_batches(n: int = 8) -> list[np.ndarray]:
    """Zipf ranks per feature, made distinct across features (feature in the high bits)."""
    rng = np.random.default_rng(0)
    offsets = np.arange(_TABLES.value, dtype=np.int64) << 40
    return [
        (rng.zipf(1.05, size=(_BATCH.value, _TABLES.value)) % _VOCAB.value).astype(np.int64)
        + offsets
        for _ in range(n)
    ]


def kernel_times(sess, ids, train, batches) -> dict[str, float]:
    """Mean kernel microseconds per step by op type (summed over threads)."""
    by_type: collections.Counter = collections.Counter()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    for i in range(_TRACE.value):
        meta = tf.compat.v1.RunMetadata()
        sess.run(train, {ids: batches[i % len(batches)]}, options=options, run_metadata=meta)
        for dev in meta.step_stats.dev_stats:
            for node in dev.node_stats:
                label = node.timeline_label.split("(")[0].split("=")[-1].strip() or node.node_name
                by_type[label] += node.op_end_rel_micros - node.op_start_rel_micros
    return {k: v / _TRACE.value for k, v in by_type.most_common()}


def main(argv):
    del argv
    import npu_rec
    from npu_rec._kernels import _build, _key_map

    npu_rec.init(bind_cpu=False, use_dynamic_expansion=True)
    batches = make_batches()
    runs = {}
    for layout in _LAYOUTS.value:
        if layout not in LAYOUTS:
            raise app.UsageError(f"--layouts must name layouts of {LAYOUTS}. Received: {layout!r}")
        for path in _PATHS.value:
            if path not in PATHS:
                raise app.UsageError(f"--paths must name paths of {PATHS}. Received: {path!r}")
            dense = _key_map.dense_maps() if path == "kernels_dense" else contextlib.nullcontext()
            with _build.forced(path != "stock"), dense:
                runs[f"{layout}/{path}"] = build(layout)
    for sess, ids, train in runs.values():  # warm up: trace, first admissions
        for b in batches * 2:
            sess.run(train, {ids: b})
    wall = {layout: [] for layout in runs}
    for _ in range(_ROUNDS.value):
        for layout, (sess, ids, train) in runs.items():
            start = time.perf_counter()
            for i in range(_STEPS.value):
                sess.run(train, {ids: batches[i % len(batches)]})
            wall[layout].append((time.perf_counter() - start) / _STEPS.value * 1e3)
    result = {}
    for layout, (sess, ids, train) in runs.items():
        kernels = kernel_times(sess, ids, train, batches)
        result[layout] = {
            "wall_ms": statistics.median(wall[layout]),
            "wall_ms_blocks": wall[layout],
            "kernel_ms": sum(kernels.values()) / 1e3,
            "kernel_ms_by_type": {k: v / 1e3 for k, v in kernels.items()},
        }
    print(f"{_TABLES.value} features x {_BATCH.value} ids a step; ms per step")
    print(f"{'layout/path':<18} {'wall':>7} {'kernels':>8}   top kernel types")
    for layout, r in result.items():
        top = ", ".join(
            f"{k} {v:.1f}" for k, v in list(r["kernel_ms_by_type"].items())[: _TOP.value]
        )
        print(f"{layout:<18} {r['wall_ms']:>7.1f} {r['kernel_ms']:>8.1f}   {top}")
    out = {
        "results": result,
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
            "tensorflow": tf.__version__,
        },
        "flags": {
            f: flags.FLAGS[f].value
            for f in ("tables", "batch_size", "vocab", "steps", "rounds", "trace_steps")
        },
    }
    with open(_OUT.value, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    app.run(main)
