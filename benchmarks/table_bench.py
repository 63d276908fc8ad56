"""Throughput and memory of npu_rec sparse tables against a fixed-size baseline.

For each table size and dim it measures, on Zipf-distributed batches of
4096 x 26 raw int64 ids (keys/s = ids processed per second):

  * `table_lookup`:      training `sparse_lookup` only (hash, admission, gather).
  * `table_step`:        lookup + Adagrad update through `record_lookups`.
  * `baseline_step`:     fixed `tf.Variable` + `tf.gather` + sparse Adagrad
                         (ResourceSparseApplyAdagradV2) on pre-hashed row ids.
  * `numpy_take`:        `np.take` of the same rows: the memory-bandwidth ceiling.
  * `stock_lookup`, `stock_step`: the lookup and the step traced on the stock
                         TensorFlow ops (`NPU_REC_KERNELS=off`), on the same table,
                         beside the compiled kernels' (`--skip_stock` leaves them out).

The four are timed in alternating blocks of 5 steps, so that other load on a
shared machine affects them alike and their ratios stay meaningful.

for each (row storage dtype, sparse optimizer) pair of `--value_dtypes` x
`--optimizers` (e.g. float32 + Adagrad against bfloat16 + RowWiseAdagrad, in
one run; with several pairs, their training steps are also timed side by side
in alternating blocks, so their step rates compare), with admission+eviction off (`access_threshold=-1`) and on (threshold 2,
eviction 3600 s; 1% of the ids are fresh keys that go through admission,
and `evict()` runs every `--evict_every` steps inside the timed loop). It also reports
bytes per live key: the table's variable bytes / live keys, the key index's
bucket array / live keys, `table.memory_stats()["bytes_per_live_key"]`, and
the growth of the process RSS while the table was created and filled (which
includes all of them).

Usage:
  python benchmarks/table_bench.py                                   # full run
  python benchmarks/table_bench.py --sizes=100000 --dims=16 --steps=10  # quick
  python benchmarks/table_bench.py --sizes=50000000 --dims=16 --modes=off --steps=5 \
      --skip_baseline                                                # 50M-key fit check
  python benchmarks/table_bench.py --sizes=1000000 --dims=16 --modes=off \
      --value_dtypes=float32,bfloat16 --optimizers=adagrad,rowwise_adagrad   # bytes per key
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import resource
import sys
import time

import numpy as np
from _table_ids import raw_keys, rss, zipf_ranks
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SIZES = flags.DEFINE_list("sizes", ["1000000", "10000000"], "Live keys per table.")
_DIMS = flags.DEFINE_list("dims", ["16", "64"], "Embedding widths.")
_MODES = flags.DEFINE_list("modes", ["off", "on"], "Admission+eviction off / on.")
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per measurement.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps first.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", 4096, "Examples per batch.", lower_bound=1)
_FIELDS = flags.DEFINE_integer("fields", 26, "Ids per example.", lower_bound=1)
_ZIPF = flags.DEFINE_float("zipf_a", 1.2, "Zipf exponent of the id distribution.")
_EVICT_EVERY = flags.DEFINE_integer(
    "evict_every", 20, "Steps between evict() calls (mode on).", lower_bound=1
)
_THREADS = flags.DEFINE_integer("threads", 2, "TF intra/inter-op threads.", lower_bound=1)
_VALUE_DTYPES = flags.DEFINE_list(
    "value_dtypes", ["float32"], "Row storage dtypes (float32, bfloat16, float16)."
)
_OPTIMIZERS = flags.DEFINE_list(
    "optimizers", ["adagrad"], "Sparse optimizers: adagrad, rowwise_adagrad (every pair is run)."
)
_PAIRS = flags.DEFINE_list(
    "pairs",
    [],
    "value_dtype/optimizer pairs to run instead of every pair of --value_dtypes x "
    "--optimizers (e.g. float32/adagrad,bfloat16/rowwise_adagrad).",
)
_HEADROOM = flags.DEFINE_float(
    "capacity_headroom",
    0.0,
    "Capacity beyond the live keys, as a share of them (each table also gets 1024 rows "
    "more); 0.125 reproduces the figures measured before (capacity = 1.125 x keys).",
    lower_bound=0.0,
)
_SKIP_BASELINE = flags.DEFINE_bool("skip_baseline", False, "Skip the tf.Variable baseline.")
_SKIP_NUMPY = flags.DEFINE_bool("skip_numpy", False, "Skip the np.take ceiling (saves a copy).")
_SKIP_STOCK = flags.DEFINE_bool(
    "skip_stock",
    False,
    "Skip the stock-op path's lookup and step (timed beside the kernel path's by default).",
)
_JSON = flags.DEFINE_string(
    "json",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "table_bench.json"),
    "Where to write results.",
)


def _zipf_ranks(rng, n_keys, count):
    return zipf_ranks(rng, _ZIPF.value, n_keys, count)


def _interleaved(cases, steps, warmup, block=5):
    """Times several step functions in alternating blocks of `block` steps.

    Other load on a shared machine then hits every case alike, so their
    ratios stay meaningful. `cases`: name -> (fn, args_list, between or None).
    Returns name -> seconds for `steps` steps.
    """
    for fn, args_list, _ in cases.values():
        for i in range(warmup):
            fn(*args_list[i % len(args_list)])
    spent = dict.fromkeys(cases, 0.0)
    for first in range(0, steps, block):
        for name, (fn, args_list, between) in cases.items():
            start = time.perf_counter()
            for i in range(first, min(steps, first + block)):
                out = fn(*args_list[i % len(args_list)])
                if between is not None:
                    between(i)
            if hasattr(out, "numpy"):
                out.numpy()
            spent[name] += time.perf_counter() - start
    return spent


def _pairs():
    """The (value_dtype, optimizer) pairs to run (`--pairs`, else the cross product)."""
    if _PAIRS.value:
        return [tuple(p.split("/", 1)) for p in _PAIRS.value]
    return [(d, o) for d in _VALUE_DTYPES.value for o in _OPTIMIZERS.value]


def _reset_peak():
    """Resets the process's peak RSS (Linux), so each table reports its own peak."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_gib():
    """The process's peak RSS since `_reset_peak` (VmHWM), in GiB."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _capacity(n_keys):
    """The tables' capacity: the live keys, `--capacity_headroom` more, and 1024."""
    return n_keys + int(n_keys * _HEADROOM.value) + 1024


def _optimizer(npu_rec, name):
    if name == "rowwise_adagrad":
        return npu_rec.optimizers.RowWiseAdagrad(0.05)
    if name == "adagrad":
        return npu_rec.optimizers.Adagrad(0.05)
    raise app.UsageError(f"--optimizers: adagrad or rowwise_adagrad. Received: {name!r}")


def bench_table(
    tf, npu_rec, n_keys, dim, mode, rng, baseline, value_dtype="float32", opt="adagrad"
):
    npu_rec.table._registry.clear()
    on = mode == "on"
    _reset_peak()
    rss0 = rss()
    table = npu_rec.create_table(
        f"bench_{n_keys}_{dim}_{mode}_{value_dtype}_{opt}",
        dim,
        optimizer=_optimizer(npu_rec, opt),
        capacity=_capacity(n_keys),
        dynamic_expansion=True,
        access_threshold=2 if on else -1,
        eviction_threshold=3600 if on else -1,
        value_dtype=value_dtype,
    )
    ids_per_batch = _BATCH.value * _FIELDS.value

    @tf.function(reduce_retracing=True)
    def fill(keys):
        # Two sightings, so keys pass admission (threshold 2) in one lookup.
        return tf.reduce_sum(npu_rec.sparse_lookup(table, tf.concat([keys, keys], 0))[:1])

    t0 = time.perf_counter()
    for start in range(0, n_keys, ids_per_batch):
        fill(tf.constant(raw_keys(np.arange(start, min(n_keys, start + ids_per_batch)))))
    fill_s = time.perf_counter() - t0
    gc.collect()
    rss_per_key_bytes = rss() - rss0
    live = int(table.size())
    # The shape through the handle: reading a variable that sparse ops have used
    # copies it (TF's copy-on-read mode), which would inflate the RSS figures.
    var_bytes = sum(
        int(np.prod(tf.raw_ops.VariableShape(input=v.handle).numpy())) * v.dtype.size
        for v in table.variables()
    )
    # The index's bucket array (12 B per bucket), as the kernel has grown it (the
    # export hands out its arrays without a copy; only the length is read).
    index_bytes = table.key_index.bucket_bytes * int(table.key_index.map.export()[0].shape[0])
    rss_per_key = rss_per_key_bytes / live
    stats = table.memory_stats()

    batches = []
    for _ in range(8):
        ranks = _zipf_ranks(rng, n_keys, ids_per_batch)
        keys = raw_keys(ranks)
        if on:
            fresh = rng.random(ids_per_batch) < 0.01
            keys[fresh] = raw_keys(rng.integers(n_keys, 1 << 40, size=int(fresh.sum())))
        batches.append((tf.constant(keys.reshape(_BATCH.value, _FIELDS.value)),))

    @tf.function
    def lookup_only(ids):
        return tf.reduce_sum(npu_rec.sparse_lookup(table, ids)[0])

    @tf.function
    def train_step(ids):
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            loss = tf.reduce_sum(tf.square(npu_rec.sparse_lookup(table, ids)))
        npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
        return loss

    cases = {}
    if not _SKIP_STOCK.value:
        # The same functions traced on the stock ops, over the same table state.
        stock_lookup = tf.function(lookup_only.python_function)
        stock_step = tf.function(train_step.python_function)
        with _stock_backend(table):
            stock_lookup.get_concrete_function(*batches[0])
            stock_step.get_concrete_function(*batches[0])
    every = _EVICT_EVERY.value
    evict = (lambda i: table.evict() if i % every == every - 1 else None) if on else None
    if on:
        table.evict()  # compile the eviction scan outside the timed loop
    rows = [(_zipf_ranks(rng, n_keys, ids_per_batch),) for _ in range(8)]
    cases.update({"lookup": (lookup_only, batches, None), "step": (train_step, batches, evict)})
    if not _SKIP_STOCK.value:
        cases["stock_lookup"] = (stock_lookup, batches, None)
        cases["stock_step"] = (stock_step, batches, evict)
    if not _SKIP_NUMPY.value:
        values = table.storage.values.numpy()[:n_keys]
        cases["numpy"] = (lambda r: np.take(values, r, axis=0), rows, None)
    if baseline is not None:
        cases["baseline"] = baseline
    spent = _interleaved(cases, _STEPS.value, _WARMUP.value)
    steps = _STEPS.value
    result = {
        "keys": n_keys,
        "dim": dim,
        "admission_eviction": mode,
        "value_dtype": value_dtype,
        "optimizer": opt,
        "live_keys": live,
        "fill_seconds": round(fill_s, 2),
        "peak_rss_gib": _peak_gib(),
        "table_lookup_keys_per_s": ids_per_batch * steps / spent["lookup"],
        "table_step_keys_per_s": ids_per_batch * steps / spent["step"],
        "stock_lookup_keys_per_s": (
            ids_per_batch * steps / spent["stock_lookup"] if "stock_lookup" in spent else None
        ),
        "stock_step_keys_per_s": (
            ids_per_batch * steps / spent["stock_step"] if "stock_step" in spent else None
        ),
        "kernels": table.backend.name == "kernels",
        "numpy_take_rows_per_s": (
            ids_per_batch * steps / spent["numpy"] if "numpy" in spent else None
        ),
        "baseline_step_keys_per_s": (
            ids_per_batch * steps / spent["baseline"] if baseline is not None else None
        ),
        "variable_bytes_per_live_key": var_bytes / live,
        "index_bytes_per_live_key": index_bytes / live,
        "rss_bytes_per_live_key": rss_per_key,
        "memory_stats": stats,
        "raw_row_plus_slot_bytes": (
            dim * (2 if value_dtype != "float32" else 4)
            + 4 * (1 if opt == "rowwise_adagrad" else dim)
        ),
    }

    _release(tf, table)
    npu_rec.table._registry.clear()
    gc.collect()
    return result


def bench_pairs(tf, npu_rec, n_keys, dim, rng, pairs):
    """Training steps of one table per (value_dtype, optimizer) pair, timed side by side.

    Each pair's table is filled with the same `n_keys` keys (admission and eviction
    off); their steps run in alternating blocks on the same batches, so the rates
    compare within the run. Returns {"value_dtype/optimizer": step keys/s}.
    """
    npu_rec.table._registry.clear()
    ids_per_batch = _BATCH.value * _FIELDS.value
    batches = [
        (tf.constant(raw_keys(_zipf_ranks(rng, n_keys, ids_per_batch)).reshape(_BATCH.value, -1)),)
        for _ in range(8)
    ]
    cases, tables = {}, []
    for value_dtype, opt in pairs:
        table = npu_rec.create_table(
            f"pair_{value_dtype}_{opt}",
            dim,
            optimizer=_optimizer(npu_rec, opt),
            capacity=_capacity(n_keys),
            dynamic_expansion=True,
            value_dtype=value_dtype,
        )
        tables.append(table)
        fill = tf.function(lambda keys, t=table: tf.reduce_sum(npu_rec.sparse_lookup(t, keys)[:1]))
        for start in range(0, n_keys, ids_per_batch):
            fill(tf.constant(raw_keys(np.arange(start, min(n_keys, start + ids_per_batch)))))

        @tf.function
        def train_step(ids, table=table):
            with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
                loss = tf.reduce_sum(tf.square(npu_rec.sparse_lookup(table, ids)))
            grads = tape.gradient(loss, [r.embeddings for r in recs])
            npu_rec.apply_recorded_gradients(recs, grads)
            return loss

        cases[f"{value_dtype}/{opt}"] = (train_step, batches, None)
    spent = _interleaved(cases, _STEPS.value, _WARMUP.value)
    for table in tables:
        _release(tf, table)
    npu_rec.table._registry.clear()
    gc.collect()
    return {name: ids_per_batch * _STEPS.value / sec for name, sec in spent.items()}


@contextlib.contextmanager
def _stock_backend(table):
    """Within the block, `table` builds its ops with the stock backend.

    The ops work on the same state: the kernels' key map takes TensorFlow's
    lookup ops, and the path of a function is fixed when it is traced.
    """
    from npu_rec.table._stock import StockBackend  # noqa: PLC0415

    chosen = table.backend
    table.backend = StockBackend()
    try:
        yield
    finally:
        table.backend = chosen


def _release(tf, table):
    """Frees a table's big buffers now (function caches may outlive the object)."""
    table.key_index.reset(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))
    for v in table.storage.per_row_variables():
        shape = tf.concat([[0], tf.shape(v)[1:]], 0)
        v.assign(tf.zeros(shape, v.dtype), read_value=False)


def bench_baseline(tf, n_keys, dim, rng):
    values = tf.Variable(
        tf.random.uniform([n_keys, dim], -0.05, 0.05),
        trainable=False,
        shape=tf.TensorShape([None, dim]),
    )
    accum = tf.Variable(
        tf.fill([n_keys, dim], 0.1), trainable=False, shape=tf.TensorShape([None, dim])
    )
    ids_per_batch = _BATCH.value * _FIELDS.value

    @tf.function
    def step(rows):
        flat = tf.reshape(rows, [-1])
        uniq, idx = tf.unique(flat, out_idx=tf.int64)
        with tf.GradientTape() as tape:
            emb_u = tf.gather(values, uniq)
            tape.watch(emb_u)
            loss = tf.reduce_sum(tf.square(tf.gather(emb_u, idx)))
        grad = tf.convert_to_tensor(tape.gradient(loss, emb_u))
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=values.handle,
            accum=accum.handle,
            lr=tf.constant(0.05),
            epsilon=tf.constant(1e-7),
            grad=grad,
            indices=uniq,
        )
        return loss

    batches = [
        (tf.constant(_zipf_ranks(rng, n_keys, ids_per_batch).reshape(_BATCH.value, _FIELDS.value)),)
        for _ in range(8)
    ]

    def release():
        for v in (values, accum):
            v.assign(tf.zeros([0, dim]), read_value=False)

    return (step, batches, None), release


def _write_json(tf, results):
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
        "steps": _STEPS.value,
        "evict_every": _EVICT_EVERY.value,
        "capacity_headroom": _HEADROOM.value,
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
        json.dump(out, f, indent=2)


def _warm_up(tf, npu_rec):
    """Runs TensorFlow's one-time start-up (thread pools, kernel library, allocator
    pools, the first traces) on a small table, so that the RSS growth measured for
    each table is the table's own."""
    pairs = _pairs()
    for threshold, (value_dtype, opt) in [(t, p) for t in (1, 2) for p in pairs]:
        table = npu_rec.create_table(
            f"warm_up_{threshold}_{value_dtype}_{opt}",
            16,
            optimizer=_optimizer(npu_rec, opt),
            capacity=1 << 16,
            dynamic_expansion=True,
            access_threshold=threshold,
            eviction_threshold=3600,
            value_dtype=value_dtype,
        )

        @tf.function
        def step(ids, table=table):
            with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
                loss = tf.reduce_sum(tf.square(npu_rec.sparse_lookup(table, ids)))
            grads = tape.gradient(loss, [r.embeddings for r in recs])
            npu_rec.apply_recorded_gradients(recs, grads)
            return loss

        for start in range(0, 3 * _BATCH.value, _BATCH.value):
            keys = raw_keys(np.arange(start, start + _BATCH.value)) + 1
            step(tf.constant(np.concatenate([keys, keys])))
        _release(tf, table)
    npu_rec.table._registry.clear()
    gc.collect()


def main(argv):
    del argv
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    import npu_rec

    rng = np.random.default_rng(0)
    _warm_up(tf, npu_rec)
    results = []
    header = (
        f"{'keys':>10} {'dim':>4} {'adm+ev':>6} {'rows':>8} {'optimizer':>15} {'lookup k/s':>12} {'step k/s':>11} "
        f"{'baseline k/s':>13} {'step/base':>9} {'lookup/np':>9} {'np rows/s':>11} "
        f"{'var B/key':>9} {'idx B/key':>9} {'rss B/key':>9} {'stock step k/s':>14} "
        f"{'step/stock':>10}"
    )
    print(header)
    for n_keys in map(int, _SIZES.value):
        for dim in map(int, _DIMS.value):
            baseline, release = (
                (None, None) if _SKIP_BASELINE.value else bench_baseline(tf, n_keys, dim, rng)
            )
            runs = [(mode, d, o) for mode in _MODES.value for d, o in _pairs()]
            for mode, value_dtype, opt in runs:
                r = bench_table(tf, npu_rec, n_keys, dim, mode, rng, baseline, value_dtype, opt)
                base = r["baseline_step_keys_per_s"]
                r["step_over_baseline"] = r["table_step_keys_per_s"] / base if base else None
                npy = r["numpy_take_rows_per_s"]
                r["lookup_over_numpy"] = r["table_lookup_keys_per_s"] / npy if npy else None
                stock = r["stock_step_keys_per_s"]
                r["step_over_stock"] = r["table_step_keys_per_s"] / stock if stock else None
                results.append(r)
                print(
                    f"{n_keys:>10} {dim:>4} {mode:>6} {value_dtype:>8} {opt:>15} "
                    f"{r['table_lookup_keys_per_s']:>12.3g} "
                    f"{r['table_step_keys_per_s']:>11.3g} {base or float('nan'):>13.3g} "
                    f"{r['step_over_baseline'] or float('nan'):>9.2f} "
                    f"{r['lookup_over_numpy'] or float('nan'):>9.2f} {npy or float('nan'):>11.3g} "
                    f"{r['variable_bytes_per_live_key']:>9.1f} "
                    f"{r['index_bytes_per_live_key']:>9.1f} "
                    f"{r['rss_bytes_per_live_key']:>9.1f} {stock or float('nan'):>14.3g} "
                    f"{r['step_over_stock'] or float('nan'):>10.2f}",
                    flush=True,
                )
                _write_json(tf, results)
            if release is not None:
                release()
            gc.collect()
            pairs = _pairs()
            if len(pairs) > 1:
                rates = bench_pairs(tf, npu_rec, n_keys, dim, rng, pairs)
                first = next(iter(rates.values()))
                side = {"keys": n_keys, "dim": dim, "step_keys_per_s": rates}
                side["over_first"] = {k: v / first for k, v in rates.items()}
                results.append({"pairs_side_by_side": side})
                print(
                    "steps side by side (admission off): "
                    + ", ".join(
                        f"{k} {v:.3g} ({side['over_first'][k]:.2f}x)" for k, v in rates.items()
                    ),
                    flush=True,
                )
                _write_json(tf, results)
    print(f"wrote {_JSON.value}")


if __name__ == "__main__":
    app.run(main)
