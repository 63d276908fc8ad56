"""Tiered table (memory + disk) against the same table all in memory, in one invocation.

Both tables get every live key a chunk at a time (`_fill`): the in-memory
table and the tiered table's `--memory_fraction` of memory rows by training
lookups (admission), the tiered table's other keys by a bulk import of
generated rows (rows, Adagrad accumulators, counts) appended straight to its
segment files under `--ssd_path`. Then both train on the same
Zipf-distributed batches of `--batch` x `--fields` raw int64 ids (lookup +
Adagrad update, one `tf.function` step): by default Zipf's law on the table's
keys (`--ids=bounded`) and a new batch every step (`--batches=0`), so the
timed steps see no batch of the warm-up. Below 20M keys (`--processes=one`)
both tables live in this process, timed in alternating blocks of 5 steps so
that other load on a shared machine hits both alike; from 20M keys
(`--processes=each`) each table runs in a child process of its own, the
in-memory one first, so that it does not take the page cache the tiered
table's records are read from (both in the same invocation).

Reported per table: steps/s, the process's CPU time per timed step (user,
system), and for the tiered one its ratio to the in-memory table, the hit
rate of the timed steps (unique keys found in memory), promotions, demotions
and bytes read/written per step, disk bytes per cold key, RAM per cold key
(`cold_index` plus liveness), the RSS growth (in all and anonymous) while the
table was made and filled (the tiered table first, alone) and, in a process
of its own, until after the timed steps, against its memory rows plus both
key indexes, the process's RSS after the steps and at peak, and (in a
process of its own) the bytes it made the disk read per step (0 when its
records come from the page cache). The fill ends with a `sync`: the bulk
import's records are on the disk before the steps. The machine's entry
says whether its kernel can report free memory to a host
(`free_page_reporting_order`, None if not) and how much it has
(`free_pages_reported_kib`, where it counts it): there the tiered table's
appends land on pages new to the host, a fault each at first touch.
`--compact`: bfloat16 rows + RowWiseAdagrad. `--skip_memory`: the tiered
table alone (sizes whose in-memory table does not fit). `--save_restore=DIR`
(one process): then save the tiered table (a full save of `TableCheckpointManager` into the
checkpoint directory DIR: memory rows in the file, sealed segments
hard-linked), free it, and in a new process (as a restart would) restore it
into a new one and time the steps again. The segment
files (and DIR) are deleted at the end, also on failure.

Usage:
  python benchmarks/tier_bench.py                          # 1M keys, 20% in memory
  python benchmarks/tier_bench.py --keys=5000000 --steps=30
  python benchmarks/tier_bench.py --keys=100000000 --memory_fraction=0.1 --compact \
      --skip_memory --steps=200
"""

from __future__ import annotations

import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from _table_ids import bounded_zipf_ranks, raw_keys, rss, zipf_ranks
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
_IDS = flags.DEFINE_enum(
    "ids",
    "bounded",
    ["bounded", "folded"],
    "bounded: Zipf's law on the table's keys (P(rank r) ~ (r + 1) ** -zipf_a, r < keys); "
    "folded: the unbounded law's draws folded into the keys (numpy's zipf modulo keys: past "
    "the keys, about a third of the draws at 1.05 and 50M keys, spread uniformly).",
)
_HISTORY = flags.DEFINE_integer(
    "history_steps",
    1000,
    "The fill gives each key the sighting count it would have after this many steps of the "
    "same law (1 + its expected draws; 0, or --ids=folded: every count 1): the counts the victim choice "
    "breaks last-seen ties with, as in a table trained for a while.",
    lower_bound=0,
)
_DISTINCT = flags.DEFINE_integer(
    "batches",
    0,
    "Distinct batches, cycled; 0: a new batch for every warm-up and timed step (a stream).",
    lower_bound=0,
)
_SSD = flags.DEFINE_string("ssd_path", None, "Directory of the disk tier (default: a temp dir).")
_THREADS = flags.DEFINE_integer("threads", 2, "TF intra/inter-op threads.", lower_bound=1)
_COMPACT = flags.DEFINE_bool(
    "compact", False, "bfloat16 rows + RowWiseAdagrad (default float32 + Adagrad)."
)
_SKIP_MEMORY = flags.DEFINE_bool(
    "skip_memory", False, "Tiered table only (no in-memory table beside it: tables that big)."
)
_SAVE = flags.DEFINE_string(
    "save_restore",
    None,
    "After the timed steps: save the tiered table into this checkpoint directory, restore "
    "it into a new tiered table and time `--steps` steps again (deleted at the end).",
)
_PROCESSES = flags.DEFINE_enum(
    "processes",
    "auto",
    ["auto", "one", "each"],
    "one: both tables in this process, timed in alternating blocks; each: each table in a "
    "child process of its own, one after the other (the in-memory table does not take the "
    "page cache the tiered table reads from); auto: each from 20M keys.",
)
_VARIANT = flags.DEFINE_enum(
    "variant",
    None,
    ["memory", "tiered", "restore"],
    "Internal: this table only (--processes=each), or restore --save_restore's version.",
)
_CHILD_OUT = flags.DEFINE_string("child_out", None, "Internal: where a child writes its result.")
_JSON = flags.DEFINE_string(
    "json",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tier_bench.json"),
    "Where the results go.",
)


def _zipf_ranks(rng, n_keys, count):
    if _IDS.value == "bounded":
        return bounded_zipf_ranks(rng, _ZIPF.value, n_keys, count)
    return zipf_ranks(rng, _ZIPF.value, n_keys, count)


def _optimizer(npu_rec):
    if _COMPACT.value:
        return npu_rec.optimizers.RowWiseAdagrad(0.05)
    return npu_rec.optimizers.Adagrad(0.05)


def _make_table(tf, npu_rec, name, tiered, ssd):
    n = _KEYS.value
    kwargs = {}
    if tiered:
        kwargs = {"memory_rows": max(1, int(n * _FRACTION.value)), "ssd_path": ssd}
    if _COMPACT.value:
        kwargs["value_dtype"] = tf.bfloat16
    return npu_rec.create_table(
        name,
        _DIM.value,
        optimizer=_optimizer(npu_rec),
        capacity=n + n // 8 + 1024,
        dynamic_expansion=True,
        access_threshold=0,
        **kwargs,
    )


_NORM = {}


def _history_counts(start, stop):
    """int64 sighting counts of ranks `start..stop` (see `--history_steps`)."""
    n, a = _KEYS.value, _ZIPF.value
    if _HISTORY.value == 0 or _IDS.value == "folded":  # the folded law: every count 1, as before
        return np.ones(stop - start, np.int64)
    if n not in _NORM:  # the law's normalizer, summed a slice at a time
        _NORM[n] = sum(
            float(np.sum(np.arange(i + 1, min(n, i + 10**7) + 1, dtype=np.float64) ** -a))
            for i in range(0, n, 10**7)
        )
    draws = _HISTORY.value * _BATCH.value * _FIELDS.value
    p = np.arange(start + 1, stop + 1, dtype=np.float64) ** -a / _NORM[n]
    return 1 + np.floor(draws * p).astype(np.int64)


def _chunk(tf, table, start, stop):
    """Generated state of keys `start..stop` (ranks), as tensors of the table's signature."""
    n = stop - start
    rng = np.random.default_rng(start)
    sig = table.state.signature(_DIM.value)
    out = {
        "keys": tf.constant(raw_keys(np.arange(start, stop))),
        "values": tf.cast(
            tf.constant(rng.uniform(-0.05, 0.05, (n, _DIM.value)).astype(np.float32)),
            sig["values"][0],
        ),
        "counts": tf.constant(_history_counts(start, stop)),
        "last_seen": tf.zeros([n], tf.int64),
    }
    for k, (dtype, shape) in sig.items():
        if k.startswith("slot/"):
            out[k] = tf.fill([n, shape[1]], tf.constant(0.1, dtype))
    return out


def _fill(tf, npu_rec, table, tiered, chunk=200_000):
    """Every live key (ranks 0..keys-1) gets a row, a chunk of keys at a time.

    Chunks of 200k keys: the memory the allocator keeps from a chunk's
    transients stays in the process's RSS (1M-key chunks left 0.48 GiB over
    the memory rows and index of a 10M-key tiered table, 200k 0.22).

    Both tables first admit keys by training lookups (initialized rows and
    slots): the in-memory table all of them, the tiered one its first
    `memory_rows` (the hottest Zipf ranks). The tiered table's other keys are
    a bulk import of generated rows appended straight to the disk tier
    (records packed and checksummed by the store, `cold_index` sized once for
    them). A one-shot `load` would hold the whole state, and TensorFlow's CPU
    allocator keeps such transients resident. The step rate does not depend
    on the values.
    """
    n = _KEYS.value
    st = table.state
    first = min(n, st.memory_rows) if tiered else n
    admit = tf.function(
        lambda k, t: tf.reduce_sum(npu_rec.sparse_lookup(table, k, timestamps=t)[:1]),
        input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)],
    )
    # One last-seen time for every admitted key, as in a table restored from a
    # checkpoint: otherwise the fill's order (hottest ranks first, over a minute)
    # would make the hottest keys the oldest, the first demoted.
    now = int(time.time())
    for start in range(0, first, chunk):
        stop = min(first, start + chunk)
        keys = tf.constant(raw_keys(np.arange(start, stop)))
        admit(keys, tf.fill(tf.shape(keys), tf.constant(now, tf.int64)))
        counts = tf.constant(np.minimum(_history_counts(start, stop), 2**31 - 1).astype(np.int32))
        st.rows.counts.scatter_update(tf.IndexedSlices(counts, st.index.lookup(keys)))
        if tiered:
            # Training lookups with no optimizer step after them: a tiered table
            # keeps every key they saw from demotion until the next step (its
            # gradient may still come), which would hold all the admitted rows
            # through the first timed step (and make each chunk's lookup merge
            # the keys of all chunks before). A fill has no gradient to come:
            # nothing stays protected.
            st.protected.assign(tf.zeros([0], tf.int64))
    if not tiered:
        return
    # Sized once for every key of the table (cold keys never pass it; a step's
    # demotions enter before its promotions leave, so the cold keys alone would
    # grow it at the first step).
    st.cold_index.reserve(n)
    names = list(st.rows.slots)
    for start in range(first, n, chunk):
        c = _chunk(tf, table, start, min(n, start + chunk))
        slots = np.concatenate([c[f"slot/{k}"].numpy() for k in names], 1) if names else None
        recs = st.store.make_records(
            c["keys"].numpy(),
            c["values"].numpy(),
            slots,
            c["counts"].numpy(),
            c["counts"].numpy(),
            c["last_seen"].numpy(),
        )
        locs = st.store.append(recs)
        del recs, slots
        st.cold_index.insert(c["keys"], tf.constant(locs))
    # The bulk import's records on the disk before the steps, as a table's cold
    # rows written long before would be (the kernel's writeback of gigabytes
    # would take CPU time from the first timed steps).
    os.sync()


def _peak_rss(field: str = "VmHWM") -> int:
    """Bytes of a /proc/self/status field (peak RSS by default)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _interleaved(cases, batches, steps, first_batch, block=5):
    """`steps` steps per case on the batches from `first_batch`, in alternating blocks.

    Returns (seconds per case, [user, system] CPU seconds of the process per
    case over its blocks).
    """
    spent = dict.fromkeys(cases, 0.0)
    cpu = {name: [0.0, 0.0] for name in cases}
    for first in range(0, steps, block):
        for name, fn in cases.items():
            start, t0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            for i in range(first, min(steps, first + block)):
                out = fn(*batches[(first_batch + i) % len(batches)])
            out.numpy()
            spent[name] += time.perf_counter() - start
            t1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[name][0] += t1.ru_utime - t0.ru_utime
            cpu[name][1] += t1.ru_stime - t0.ru_stime
    return spent, cpu


def _storage_read_bytes() -> int:
    """Bytes this process has made the storage layer read (`read_bytes` of /proc/self/io)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        return 0


def _memory() -> dict[str, int]:
    """The process's resident bytes: in all, and anonymous (its own, no file pages)."""
    return {"total": _peak_rss("VmRSS"), "anon": _peak_rss("RssAnon")}


def _batches(tf, seed=0):
    """The batches of the warm-up, then of the timed steps (`--batches`: cycled)."""
    rng = np.random.default_rng(seed)
    ids_per_batch = _BATCH.value * _FIELDS.value
    n = _DISTINCT.value or _WARMUP.value + _STEPS.value
    return [
        (
            tf.constant(
                raw_keys(_zipf_ranks(rng, _KEYS.value, ids_per_batch)).reshape(
                    _BATCH.value, _FIELDS.value
                )
            ),
        )
        for _ in range(n)
    ]


def _step_fn(tf, npu_rec, table):
    @tf.function
    def train_step(ids):
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            loss = tf.reduce_sum(tf.square(npu_rec.sparse_lookup(table, ids)))
        grads = tape.gradient(loss, [r.embeddings for r in recs])
        npu_rec.apply_recorded_gradients(recs, grads)
        return loss

    return train_step


def _separate() -> bool:
    """Whether each table runs in its own process (`--processes`)."""
    if _SKIP_MEMORY.value or _PROCESSES.value == "one":
        return False
    return _PROCESSES.value == "each" or _KEYS.value >= 20_000_000


def main(argv):
    del argv
    if _VARIANT.value == "restore":
        return _restore_child()
    if _VARIANT.value:
        return _child(_VARIANT.value)
    if _separate():
        return _parent()
    import tensorflow as tf

    import npu_rec

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    ssd = _SSD.value or tempfile.mkdtemp(prefix="tier_bench_")
    batches = _batches(tf)
    tables, fill, growth = {}, {}, {}
    kinds = (("tiered", True),) if _SKIP_MEMORY.value else (("tiered", True), ("memory", False))
    try:
        for name, tiered in kinds:  # tiered first: its RSS growth is measured alone
            m0 = _memory()
            t0 = time.perf_counter()
            tables[name] = _make_table(tf, npu_rec, name, tiered, ssd)
            _fill(tf, npu_rec, tables[name], tiered)
            fill[name] = time.perf_counter() - t0
            gc.collect()
            m1 = _memory()
            growth[name] = {k: m1[k] - m0[k] for k in m0}
            print(
                f"{name}: filled in {fill[name]:.1f} s, RSS +{growth[name]['total'] / 2**30:.2f} "
                f"GiB (anonymous +{growth[name]['anon'] / 2**30:.2f})",
                flush=True,
            )
        _run(tf, npu_rec, tables, batches, fill, growth, ssd)
    finally:
        _close(tables.values())
        if _SAVE.value:
            shutil.rmtree(_SAVE.value, ignore_errors=True)
        if _SSD.value is None:
            shutil.rmtree(ssd, ignore_errors=True)


def _close(tables):
    for t in tables:
        for shard in t.shards:
            store = getattr(shard.state, "store", None)
            if store is not None:
                store.close()


def _parent():
    """Each table in a child process of its own, the in-memory one first, then the tiered one.

    At 50M keys the in-memory table (~9 GiB) beside the tiered one would take
    the page cache the tiered table's records (7 GiB) are read from: alone,
    each child times its table as a process with only that table would run.
    """
    results, machine = [], None
    with tempfile.TemporaryDirectory(prefix="tier_bench_children_") as tmp:
        for name in ("memory", "tiered"):
            out = os.path.join(tmp, f"{name}.json")
            argv = [a for a in sys.argv[1:] if not a.startswith(("--json", "--processes"))]
            cmd = [sys.executable, os.path.abspath(__file__), *argv]
            cmd += [f"--variant={name}", f"--child_out={out}", "--processes=one"]
            print(f"{name}: own process, load average {os.getloadavg()}", flush=True)
            subprocess.run(cmd, check=True)
            with open(out) as f:
                child = json.load(f)
            results.append(child["result"])
            machine = child["machine"]
    mem, tier = results
    tier["ratio_to_memory"] = tier["steps_per_s"] / mem["steps_per_s"]
    _report([tier, mem], machine, has_memory=True)


def _child(name):
    """One table in this process: filled, trained, its result written to `--child_out`."""
    import tensorflow as tf

    import npu_rec

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    ssd = _SSD.value or tempfile.mkdtemp(prefix="tier_bench_")
    tiered = name == "tiered"
    batches = _batches(tf)
    table = None
    try:
        m0 = _memory()
        t0 = time.perf_counter()
        table = _make_table(tf, npu_rec, name, tiered, ssd)
        _fill(tf, npu_rec, table, tiered)
        fill = time.perf_counter() - t0
        gc.collect()
        m1 = _memory()
        growth = {k: m1[k] - m0[k] for k in m0}
        print(
            f"{name}: filled in {fill:.1f} s, RSS +{growth['total'] / 2**30:.2f} GiB "
            f"(anonymous +{growth['anon'] / 2**30:.2f})",
            flush=True,
        )
        hot_bytes = _hot_bytes(table) if tiered else {}
        fn = _step_fn(tf, npu_rec, table)
        spent, d, after, extra = _timed(table, {name: fn}, batches, tiered)
        m2 = _memory()
        r = _result(name, table, _STEPS.value / spent[name], fill, growth, d, after, hot_bytes)
        r.update(extra[name])
        r["rss_growth_after_steps_gib"] = (m2["total"] - m0["total"]) / 2**30
        r["rss_anon_growth_after_steps_gib"] = (m2["anon"] - m0["anon"]) / 2**30
        r["load_average"] = os.getloadavg()
        with open(_CHILD_OUT.value, "w") as f:
            json.dump({"result": r, "machine": _machine(tf)}, f)
    finally:
        if table is not None:
            _close([table])
        if _SSD.value is None:
            shutil.rmtree(ssd, ignore_errors=True)


def _hot_bytes(table):
    cold = int(table.tier_stats()["cold_keys"])
    return {k: int(v) for k, v in table.memory_stats().items()} if cold < 10**8 else {}


def _timed(tier_table, cases, batches, tiered):
    """Warm-up, then the timed steps.

    Returns (seconds per table, tier counter deltas, counters after, extra
    figures per table: CPU time per step, and bytes read from the storage
    device per step over the warm-up and timed steps).
    """
    read0 = _storage_read_bytes()
    for fn in cases.values():  # warm-up: trace, and let the hot set settle
        for i in range(_WARMUP.value):
            fn(*batches[i % len(batches)])
    before = tier_table.tier_stats() if tiered else {}
    spent, cpu = _interleaved(cases, batches, _STEPS.value, _WARMUP.value)
    after = tier_table.tier_stats() if tiered else {}
    d = {k: after[k] - before[k] for k in before if isinstance(before[k], int)}
    n = _STEPS.value
    extra = {
        name: {
            # Both intra-op threads' time (idle ones spin a while before they sleep).
            "cpu_user_ms_per_step": 1e3 * user / n,
            "cpu_system_ms_per_step": 1e3 * system / n,
        }
        for name, (user, system) in cpu.items()
    }
    if len(cases) == 1:  # the process's reads are this table's: ~0 when its records are cached
        read = (_storage_read_bytes() - read0) / (_WARMUP.value + n) / 1e6
        extra[next(iter(cases))]["storage_read_mb_per_step"] = read
    return spent, d, after, extra


def _result(name, table, steps_per_s, fill, growth, d, after, hot_bytes):
    steps = _STEPS.value
    r = {
        "table": name,
        "keys": _KEYS.value,
        "memory_rows": table.config.memory_rows or _KEYS.value,
        "steps_per_s": steps_per_s,
        "fill_s": fill,
        "rss_growth_gib": growth["total"] / 2**30,
        "rss_anon_growth_gib": growth["anon"] / 2**30,
        "size": int(table.size()),
    }
    if name != "tiered":
        return r
    cold = int(after["cold_keys"])
    r.update(
        {
            "hit_rate": d["hits"] / max(d["lookups"], 1),
            "promotions_per_step": d["promotions"] / steps,
            "demotions_per_step": d["demotions"] / steps,
            "mb_read_per_step": d["bytes_read"] / steps / 1e6,
            "mb_written_per_step": d["bytes_written"] / steps / 1e6,
            "compactions": after["compactions"],
            "cold_keys": after["cold_keys"],
            "disk_bytes_per_cold_key": after["disk_bytes_per_key"],
            "cold_index_gib": after["cold_index_bytes"] / 2**30,
            "cold_index_bytes_per_cold_key": after["cold_index_bytes"] / max(cold, 1),
            # The cold index plus the store's liveness bytes, per cold key.
            "ram_bytes_per_cold_key": after["ram_bytes_per_cold_key"],
            "rss_after_steps_gib": rss() / 2**30,
            # Page cache mapped by the process would count in RSS; the anonymous
            # part is the process's own.
            "rss_anon_after_steps_gib": _peak_rss("RssAnon") / 2**30,
            "peak_rss_gib": _peak_rss() / 2**30,
        }
    )
    if hot_bytes:
        # The bound of the acceptance: memory rows (values, slots, metadata)
        # plus both key indexes, plus 1 GiB.
        held = hot_bytes["rows"] + hot_bytes["slots"] + hot_bytes["metadata"]
        r["memory_rows_plus_index_gib"] = (held + hot_bytes["index"]) / 2**30
    return r


def _page_reporting(name):
    """A parameter of the kernel's free page reporting (int), or None where it has none.

    A virtual machine's kernel that reports free memory to its host hands those
    pages back: a page the guest takes from its free memory is then most often
    a new page for the host, paid for at its first touch. The tiered table's
    appends land on such pages until the page cache fills the memory.
    """
    try:
        with open(f"/sys/module/page_reporting/parameters/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _machine(tf):
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "free_page_reporting_order": _page_reporting("page_reporting_order"),
        # Reported so far, where the kernel counts it: > 0 when pages went back.
        "free_pages_reported_kib": _page_reporting("reported_kib"),
    }


def _run(tf, npu_rec, tables, batches, fill, growth, ssd):
    tier_table = tables["tiered"]
    hot_bytes = _hot_bytes(tier_table)
    cases = {name: _step_fn(tf, npu_rec, t) for name, t in tables.items()}
    spent, d, after, extra = _timed(tier_table, cases, batches, True)
    results = [
        _result(name, t, _STEPS.value / spent[name], fill[name], growth[name], d, after, hot_bytes)
        | extra[name]
        for name, t in tables.items()
    ]
    if "memory" in spent:
        results[0]["ratio_to_memory"] = spent["memory"] / spent["tiered"]
    if _SAVE.value:
        results[0].update(_save_restore(tf, npu_rec, tier_table, ssd))
    _report(results, _machine(tf), has_memory="memory" in spent)


def _report(results, machine, has_memory):
    """Prints the table and writes the JSON (`results[0]`: the tiered table)."""
    n, steps = _KEYS.value, _STEPS.value
    print(
        f"{n} keys, dim {_DIM.value}, batch {_BATCH.value} x {_FIELDS.value}, "
        f"Zipf {_ZIPF.value} ({_IDS.value}), "
        + (f"{_DISTINCT.value} batches cycled" if _DISTINCT.value else "a new batch every step")
        + f", {steps} timed steps"
        + (", each table in its own process" if _separate() else "")
    )
    print(
        f"{'table':8} {'mem rows':>10} {'steps/s':>8} {'ratio':>6} {'hit':>6} "
        f"{'prom/st':>8} {'MB r/w per step':>16} {'RSS GiB':>8} {'anon':>6}"
    )
    for r in results:
        ratio = r.get("ratio_to_memory", 1.0 if has_memory else float("nan"))
        hit = r.get("hit_rate", 1.0)
        prom = r.get("promotions_per_step", 0.0)
        rw = f"{r.get('mb_read_per_step', 0):.1f}/{r.get('mb_written_per_step', 0):.1f}"
        grown = r.get("rss_growth_after_steps_gib", r["rss_growth_gib"])
        anon = r.get("rss_anon_growth_after_steps_gib", r["rss_anon_growth_gib"])
        print(
            f"{r['table']:8} {r['memory_rows']:>10} {r['steps_per_s']:>8.2f} {ratio:>6.2f} "
            f"{hit:>6.3f} {prom:>8.0f} {rw:>16} {grown:>8.2f} {anon:>6.2f}"
        )
    for r in results:
        print(
            f"{r['table']}: CPU per step {r['cpu_user_ms_per_step']:.1f} ms user, "
            f"{r['cpu_system_ms_per_step']:.1f} ms system"
        )
    if (machine.get("free_pages_reported_kib") or 0) > 0:
        print(
            "this kernel reports free memory to its host (free page reporting): the "
            "tiered table's appends pay a host fault per new page cache page"
        )
    tier = results[0]
    bound = tier.get("memory_rows_plus_index_gib")
    print(
        f"tiered: peak RSS {tier['peak_rss_gib']:.2f} GiB, RAM per cold key "
        f"{tier['ram_bytes_per_cold_key']:.1f} B (cold_index "
        f"{tier['cold_index_bytes_per_cold_key']:.1f} B)"
        + (f", memory rows + index {bound:.2f} GiB" if bound is not None else "")
        + (
            f", storage reads {tier['storage_read_mb_per_step']:.2f} MB per step"
            if "storage_read_mb_per_step" in tier
            else ""
        )
        + (
            f", saved in {tier['save_s']:.1f} s ({tier['save_bytes_written'] / 2**20:.0f} MiB "
            f"written, {tier['save_files_linked']} segment files linked), restored in "
            f"{tier['restore_s']:.1f} s in a new process (peak RSS "
            f"{tier['restore_process_peak_rss_gib']:.2f} GiB), after restore "
            f"{tier['steps_per_s_after_restore']:.2f} steps/s"
            if "steps_per_s_after_restore" in tier
            else ""
        )
    )
    out = {
        "machine": machine,
        "command": " ".join(sys.argv),
        "batch": _BATCH.value,
        "fields": _FIELDS.value,
        "zipf_a": _ZIPF.value,
        "ids": _IDS.value,
        "distinct_batches": _DISTINCT.value or _WARMUP.value + steps,
        "dim": _DIM.value,
        "steps": steps,
        "separate_processes": _separate(),
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
        json.dump(out, f, indent=2)


def _save_restore(tf, npu_rec, table, ssd):
    """Saves `table` (full), then a fresh process restores the version and times steps on it."""
    from npu_rec.checkpoint import TableCheckpointManager, read_file

    shutil.rmtree(_SAVE.value, ignore_errors=True)
    t0 = time.perf_counter()
    path = TableCheckpointManager(_SAVE.value, [table]).save(1)
    save_s = time.perf_counter() - t0
    meta = read_file(path)[1]
    file_bytes = os.path.getsize(path)
    cold = [s for t in meta.get("cold", {}).values() for s in t["shards"]]
    copied = sum(s["bytes_copied"] for s in cold)
    linked = sum(f["linked"] for s in cold for f in s["files"])
    saving_peak = _peak_rss() / 2**30
    for shard in table.shards:  # its segment files go before the restore writes new ones
        shard.state.store.close()
        # and its cold index's buckets (GiBs) before the restore builds new ones
        shard.state.cold_index.reset(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))
    gc.collect()
    npu_rec.shutdown()
    # A restart restores into a process of its own: its RSS is the restore's alone.
    restored = os.path.join(ssd, "restored")
    with tempfile.TemporaryDirectory(prefix="tier_bench_restore_") as tmp:
        out = os.path.join(tmp, "restore.json")
        argv = [a for a in sys.argv[1:] if not a.startswith(("--json", "--ssd_path"))]
        cmd = [sys.executable, os.path.abspath(__file__), *argv, f"--ssd_path={restored}"]
        cmd += ["--variant=restore", f"--child_out={out}"]
        print(f"restore: own process, load average {os.getloadavg()}", flush=True)
        subprocess.run(cmd, check=True)
        with open(out) as f:
            r = json.load(f)["result"]
    shutil.rmtree(_SAVE.value, ignore_errors=True)
    return {
        "save_s": save_s,
        # Bytes a save wrote: the file (memory rows) and the open segments' records.
        "save_bytes_written": file_bytes + copied,
        "save_files_linked": linked,
        "peak_rss_gib": saving_peak,
        **r,
    }


def _restore_child():
    """Restores `--save_restore`'s version into a new tiered table and times the steps on it."""
    import tensorflow as tf

    import npu_rec
    from npu_rec.checkpoint import TableCheckpointManager

    tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    # Other batches than before the save: the restored memory rows would hold
    # every key of the same ones.
    batches = _batches(tf, seed=1)
    m0 = _memory()
    again = _make_table(tf, npu_rec, "tiered", True, _SSD.value)  # the name the file holds
    try:
        t0 = time.perf_counter()
        TableCheckpointManager(_SAVE.value, [again]).restore()
        restore_s = time.perf_counter() - t0
        size = int(again.size())
        restore_peak = _peak_rss() / 2**30
        fn = _step_fn(tf, npu_rec, again)
        for i in range(_WARMUP.value):
            fn(*batches[i % len(batches)])
        t0 = time.perf_counter()
        for i in range(_STEPS.value):
            out = fn(*batches[(_WARMUP.value + i) % len(batches)])
        out.numpy()
        again_s = time.perf_counter() - t0
        m1 = _memory()
        r = {
            "restore_s": restore_s,
            "restored_size": size,
            "steps_per_s_after_restore": _STEPS.value / again_s,
            "restore_peak_rss_gib": restore_peak,
            "restore_process_peak_rss_gib": _peak_rss() / 2**30,
            "restore_process_rss_growth_gib": (m1["total"] - m0["total"]) / 2**30,
            "restore_process_load_average": os.getloadavg(),
        }
        with open(_CHILD_OUT.value, "w") as f:
            json.dump({"result": r}, f)
    finally:
        _close([again])


if __name__ == "__main__":
    app.run(main)
