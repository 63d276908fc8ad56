"""Multi-worker throughput: 2 workers x 1 thread against 1 process x 2 threads (DLRM model).

The model and data are those of `keras_bench.py` (26 categorical features of raw
int64 ids, Zipf over `--distinct_ids` ids split like Criteo's cardinalities, 13 dense
features, dim 16, bottom MLP 13-64-16, top MLP 432-256-128-1, Adam on the dense part,
Adagrad on one `SparseEmbedding` table per feature, no admission or eviction).

  one_process  `RecModel.fit` in one process with 2 TensorFlow threads, on global
               batches of --batch_size
  two_workers  the same model under `MultiWorkerMirroredStrategy`, 2 worker processes
               (started by `npu_rec.launch`) with 1 thread each; every table is sharded
               by key hash across them, each worker trains on half of every global batch

`--one_table` uses one table for all 26 features instead; `--mlp_only` keeps the dense
model and replaces the 26 embeddings by a fixed function of the ids (no tables: the
strategy's dense all-reduce alone). Either way a training step exchanges the ids of
all its tables at once (docs/distributed.md, "Communication per step").
Both time `--steps` steps after `--warmup` untimed ones (tracing), `--rounds` times,
and report the median samples/s of the global batch; `--pairs N` runs the two back to
back N times and reports the median of the N ratios (the load of a shared machine
drifts between runs). The two-worker run also reports
the bytes each worker sends (= receives) per step, computed from the batches' unique
ids with the exchange's layout (`exchange_bytes`: the size exchange, the ids with
table, count and time, the rows back, the gradients out, each part padded to the
largest part's size bucket; the dense all-reduce), and the step time it would need on
a 10 Gb/s link, the collectives of one training step counted by kind from the step's
graph as TensorFlow executes it (run metadata of the first `fit`, see
`step_collectives`), and each worker's thread count at the end (`Threads:` of
/proc/self/status; it stays flat over a run, see `dist_threads.py`). Both runs then
profile `--trace_steps` more steps and split a step's time into compute (TensorFlow ops),
collectives and the rest (`step_split`, `split_trace`).

Right after each pair, in the same sitting, TorchRec's run on the same batches
(`torchrec_dist_worker.py`, started with `--torchrec_python`): one process x 2 threads,
then 2 ranks x 1 thread on gloo over 127.0.0.1, `DistributedModelParallel` over an
`EmbeddingBagCollection` of the same 26 tables (rows: min(vocab, --hash_buckets), ids by
modulo), FBGEMM's fused row-wise Adagrad, sharded per `--torchrec_sharding` (table-wise,
row-wise), the same MLP under DistributedDataParallel. It needs torch, fbgemm-gpu-cpu
and torchrec (the `bench` extra, docs/benchmarks.md); without them its rows say skipped.
Prints a table and writes JSON.

Example (quick):
  python benchmarks/dist_bench.py --batch_size 1024 --steps 10 --rounds 2 --distinct_ids 1000000
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

_ROLE = os.environ.get("DIST_BENCH_ROLE", "driver")
if _ROLE == "worker":  # the strategy comes before any other TensorFlow op
    import npu_rec.distribute  # noqa: E402

    _STRATEGY = npu_rec.distribute.multi_worker_strategy(timeout_seconds=300)  # the watchdog

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import keras_bench as kb  # noqa: E402  (its flags: batch_size, steps, ...)

_OUT = flags.DEFINE_string(
    "dist_out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "dist_bench.json"),
    "JSON output path.",
)
_ONE_TABLE = flags.DEFINE_bool(
    "one_table",
    False,
    "One table for all 26 features (table batching: one exchange "
    "per step instead of one per feature).",
)
_MLP_ONLY = flags.DEFINE_bool(
    "mlp_only",
    False,
    "No tables: the 26 embeddings are a fixed function of the ids (the dense model alone).",
)
_PAIRS = flags.DEFINE_integer(
    "pairs",
    1,
    "Back-to-back (one process, two workers) runs; the ratio is the median over the pairs.",
    lower_bound=1,
)
_TRACE_STEPS = flags.DEFINE_integer(
    "trace_steps",
    5,
    "Steps traced with the TensorFlow profiler after the timed rounds, to split a step's "
    "time into TensorFlow ops running and the rest (see `step_split`); 0: none.",
    lower_bound=0,
)
_KEEP_TRACES = flags.DEFINE_string(
    "keep_traces",
    None,
    "Folder that keeps the profiles of `--trace_steps` (for TensorBoard's profile plugin); "
    "default: they are deleted once split.",
)
_TORCHREC_PYTHON = flags.DEFINE_string(
    "torchrec_python",
    None,
    "Python that runs TorchRec's run (one with the `bench` extra and torchrec installed, "
    "docs/benchmarks.md); default: this one. Without torch, fbgemm-gpu or torchrec there "
    "the TorchRec rows say skipped.",
)
_TORCHREC_SHARDING = flags.DEFINE_list(
    "torchrec_sharding",
    ["table_wise", "row_wise"],
    "TorchRec's 2-rank runs, by the tables' sharding (table_wise, row_wise); empty: none.",
)
_LINK = 10e9 / 8  # bytes/s of a 10 Gb/s link
# A TensorFlow op's trace event is named "node:OpType" (host tracer level 2).
_OP_EVENT = re.compile(r"^[^\s:]+:[A-Za-z0-9_]+$")
_NUM_WORKERS = 2
_TOP_OPS = 25  # op types and nodes per traced run in the JSON (`split_trace`)


def exchange_bytes(
    keys_per_worker: list[list[np.ndarray]], dim: int, dense_params: int, training: bool = True
) -> dict:
    """Bytes one worker sends (and receives) over the network in a step, mean over workers.

    Args:
      keys_per_worker: per worker, per table, its batch's unique ids (int64).
      dim: Embedding width (every table's).
      dense_params: Dense parameters (all-reduced in float32 by a ring).
      training: a training step (ids with count and time; gradients back to the owners).

    The layout of `npu_rec.distribute._step_exchange.Lookups` with every table in one
    exchange: each worker's (table, id) pairs go to the owner of the id; every part is
    padded to the largest part of the W x W size matrix rounded up to a size bucket;
    a worker's own part does not cross the network.
    """
    from npu_rec.distribute._exchange import BUCKETS
    from npu_rec.table._sharded import shard_of_numpy

    w = len(keys_per_worker)
    sizes = np.zeros((w, w), np.int64)
    for r, tables in enumerate(keys_per_worker):
        for keys in tables:
            sizes[r] += np.bincount(shard_of_numpy(keys, w), minlength=w)
    pad = int(BUCKETS[np.searchsorted(BUCKETS, max(int(sizes.max()), 1))])
    per_item = (32 if training else 16) + (8 + 4 * dim) + (4 * dim if training else 0)
    sparse = (w - 1) * pad * per_item + (w - 1) * w * 4  # + the size exchange
    dense = 2 * (w - 1) / w * 4 * dense_params
    useful = float((sizes.sum() - np.trace(sizes)) / w * per_item)
    return {
        "sparse": float(sparse),
        "sparse_unpadded": useful,
        "dense": float(dense),
        "total": float(sparse + dense),
        "pad": pad,
    }


def _model(batches, vocab):
    import keras

    import npu_rec
    from npu_rec.keras import RecModel, SparseEmbedding

    dense = keras.Input((kb.NUM_DENSE,), name="numeric")
    cats = keras.Input((kb.NUM_CAT,), dtype="int64", name="cats")
    opt = npu_rec.optimizers.Adagrad(kb.LR)
    if _MLP_ONLY.value:  # a fixed function of the ids in place of each embedding
        ids = keras.ops.cast(keras.ops.mod(cats, 1009), "float32") / 1009.0 - 0.5
        embs = [keras.ops.repeat(ids, kb.DIM, axis=1)]
    elif _ONE_TABLE.value:  # the ids of different features are distinct in this data
        emb = SparseEmbedding(
            "all_C",
            kb.DIM,
            optimizer=opt,
            dynamic_expansion=True,
            capacity=sum(min(v, 1 << 20) for v in vocab),
        )(cats)
        embs = [keras.layers.Reshape((kb.NUM_CAT * kb.DIM,))(emb)]
    else:
        embs = [
            SparseEmbedding(
                f"C{i + 1}", kb.DIM, optimizer=opt, capacity=min(v, 1 << 20), dynamic_expansion=True
            )(cats[:, i])
            for i, v in enumerate(vocab)
        ]
    model = RecModel({"numeric": dense, "cats": cats}, kb.mlp(dense, embs))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def _dataset(batches):
    import tensorflow as tf

    ds = kb.cycled(
        {"numeric": np.stack([b[0] for b in batches]), "cats": np.stack([b[1] for b in batches])},
        np.stack([b[2] for b in batches]),
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def threads() -> int:
    """This process's thread count (Python and native), from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def step_collectives(first_fit) -> dict:
    """Collective ops per kind in the training step's executed graph, by run metadata.

    `first_fit` must trace the step (the model's first `fit`): TensorFlow records the
    graph of every function it instantiates while run metadata is on (after its
    optimisations and partitioning, as it runs). The step's graph is the one that
    reads the batch (`IteratorGetNext`) with the most collectives; with one step per
    compiled call it runs once per step.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        first_fit()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    best: dict = {}
    for function in metadata.function_graphs:
        nodes = [n for g in function.partition_graphs for n in g.node]
        nodes += [
            n for g in function.partition_graphs for f in g.library.function for n in f.node_def
        ]
        if not any(n.op == "IteratorGetNext" for n in nodes):
            continue
        counts: dict = {}
        for node in nodes:
            if node.op.startswith("Collective"):
                counts[node.op] = counts.get(node.op, 0) + 1
        if sum(counts.values()) > sum(best.values()):
            best = counts
    return best


def _union_ns(intervals) -> int:
    """Length of the union of [start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def step_split(model, ds, steps: int) -> dict:
    """Per step, milliseconds of compute, of collectives and of the rest.

    Traces `steps` steps of `model.fit` with the TensorFlow profiler (host tracer
    level 2: an event per op kernel run, on the thread that runs it; a collective's
    event lasts from its start to its completion, on the collective executor's
    thread, so it includes the transfers and the wait for the other workers). A step's
    window runs from its `on_train_batch_begin` to its `on_train_batch_end`; see
    `split_trace` for the parts.
    """
    import keras
    import tensorflow as tf

    class _Mark(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.trace = tf.profiler.experimental.Trace("dist_bench_step")
            self.trace.__enter__()

        def on_train_batch_end(self, batch, logs=None):
            self.trace.__exit__(None, None, None)

    logdir = tempfile.mkdtemp(prefix="dist_bench_trace_", dir=_KEEP_TRACES.value)
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0)
    tf.profiler.experimental.start(logdir, options=options)
    try:
        model.fit(
            ds, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False, callbacks=[_Mark()]
        )
    finally:
        tf.profiler.experimental.stop()
    try:
        return split_trace(logdir)
    finally:
        if not _KEEP_TRACES.value:
            shutil.rmtree(logdir, ignore_errors=True)


def split_trace(logdir: str) -> dict:
    """The step windows of a profile in `logdir` split into three parts, ms per step.

    `compute`: at least one op other than a collective runs (`top_ops_ms`,
    `top_nodes_ms`: the op types and nodes that ran longest, summed over threads); `collectives`: only
    collectives run (a collective overlapping compute counts as compute); `rest`:
    no op runs (Keras' per-step Python work, the step function's dispatch). The
    one-process run's `collectives` is zero and its `rest` is the per-step Python
    work alone, so a worker's time communicating or waiting is its `collectives`
    plus its `rest` minus the one process's `rest`. The profiler slows the traced
    steps a little.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(
        glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))[0], "rb"
    ) as f:
        space.ParseFromString(f.read())
    windows, compute, collective, by_type, by_node = [], [], [], {}, {}
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                start = line.timestamp_ns * 1000 + event.offset_ps  # picoseconds
                if name == "dist_bench_step":
                    windows.append((start, start + event.duration_ps))
                elif _OP_EVENT.match(name):
                    op_type = name.split(":")[1]
                    kind = collective if op_type.startswith("Collective") else compute
                    kind.append((start, start + event.duration_ps))
                    by_type.setdefault(op_type, []).append((start, start + event.duration_ps))
                    by_node.setdefault(name, []).append((start, start + event.duration_ps))

    def clipped(events):  # the steps run one after the other
        return [
            (max(s, ws), min(e, we)) for s, e in events for ws, we in windows if s < we and e > ws
        ]

    wall = _union_ns(windows)
    busy = _union_ns(clipped(compute))
    any_op = _union_ns(clipped(compute + collective))
    n = max(len(windows), 1)
    return {
        "steps": len(windows),
        "step_ms": wall / n / 1e9,
        "compute_ms": busy / n / 1e9,
        "collectives_ms": (any_op - busy) / n / 1e9,
        "rest_ms": (wall - any_op) / n / 1e9,
        # The op types that ran longest (summed over threads, ms per step).
        "top_ops_ms": _longest(by_type, clipped, n),
        "top_nodes_ms": _longest(by_node, clipped, n),
    }


def _longest(events: dict, clipped, steps: int) -> dict:
    """The `_TOP_OPS` keys of `events` whose events lasted longest: ms per step."""
    total = {k: sum(e - s for s, e in clipped(ev)) / steps / 1e9 for k, ev in events.items()}
    return dict(sorted(total.items(), key=lambda item: -item[1])[:_TOP_OPS])


def _train(strategy):
    """Times the model under `strategy`: samples/s per round (global batch), and more."""
    import keras

    batches, vocab = kb.make_batches()
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = _model(batches, vocab)
    train = kb.fit_runner(model, _dataset(batches))
    collectives = step_collectives(lambda: train(kb._WARMUP.value))
    rates = []
    for _ in range(kb._ROUNDS.value):
        rates.append(kb._BATCH.value * kb._STEPS.value / train(kb._STEPS.value))
    dense_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    split = step_split(model, _dataset(batches), _TRACE_STEPS.value) if _TRACE_STEPS.value else {}
    return rates, batches, dense_params, collectives, split


def _run_role(out_path: str) -> None:
    import tensorflow as tf

    if _ROLE == "worker":
        rates, batches, dense_params, collectives, split = _train(_STRATEGY)
        rank = npu_rec.distribute.worker_rank(_STRATEGY)
        half = kb._BATCH.value // _NUM_WORKERS
        features = (
            []
            if _MLP_ONLY.value
            else [list(range(kb.NUM_CAT))]
            if _ONE_TABLE.value
            else [[f] for f in range(kb.NUM_CAT)]
        )
        keys = [
            [
                [np.unique(b[1][r * half : (r + 1) * half, f]) for f in features]
                for r in range(_NUM_WORKERS)
            ]
            for b in batches
        ]
        per_step = [exchange_bytes(k, kb.DIM, dense_params) for k in keys]
        result = {
            "rank": rank,
            "rates": rates,
            "bytes": {k: statistics.mean(p[k] for p in per_step) for k in per_step[0]},
            "collectives_per_step": collectives,
            "threads_at_end": threads(),
            "step_split": split,
        }
        out_path = _rank_path(out_path, rank)
    else:
        rates, _, _, _, split = _train(tf.distribute.get_strategy())
        result = {"rates": rates, "step_split": split}
    with open(out_path, "w") as f:
        json.dump(result, f)


def _rank_path(path: str, rank: int) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}-{rank}{ext}"


def _child_env(role: str, threads: int) -> dict:
    env = {
        **os.environ,
        "DIST_BENCH_ROLE": role,
        "PYTHONPATH": _ROOT,
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
    }
    env.pop("TF_CONFIG", None)
    return env


def _flag_args() -> list[str]:
    return [
        f"--{name}={getattr(flags.FLAGS, name)}"
        for name in (
            "batch_size",
            "steps",
            "rounds",
            "warmup",
            "distinct_batches",
            "distinct_ids",
            "one_table",
            "mlp_only",
            "trace_steps",
        )
    ] + ([f"--keep_traces={_KEEP_TRACES.value}"] if _KEEP_TRACES.value else [])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrec_run(tmp: str, batches: str, sizes: str, world: int, sharding: str) -> dict:
    """TorchRec's run on `world` ranks (benchmarks/torchrec_dist_worker.py), gloo on
    127.0.0.1; each rank has 1 thread, a world of 1 has 2 (the baseline). The ranks
    stop by themselves (every collective has a timeout); past an hour they are killed."""
    import signal

    python = _TORCHREC_PYTHON.value or sys.executable
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrec_dist_worker.py")
    out = os.path.join(tmp, f"torchrec-{world}-{sharding}.json")
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **_child_env("torchrec", 2 if world == 1 else 1),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            "TORCHREC_THREADS": str(2 if world == 1 else 1),
            # OpenMP threads that sleep when idle: spinning ones slowed the 2-thread
            # baseline 10-40x on a shared, loaded machine (no effect on 1 thread).
            "OMP_WAIT_POLICY": "PASSIVE",
        }
        with open(os.path.join(tmp, f"torchrec-{world}-{sharding}-{rank}.log"), "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        python,
                        worker,
                        f"--batches={batches}",
                        f"--sizes={sizes}",
                        f"--lr={kb.LR}",
                        f"--sharding={sharding}",
                        f"--warmup={kb._WARMUP.value}",
                        f"--steps={kb._STEPS.value}",
                        f"--rounds={kb._ROUNDS.value}",
                        "--timeout=300",
                        f"--out={out}",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=3600))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            codes.append(proc.wait())
    if not os.path.exists(out):
        return {"failed": f"exit codes {codes}; output: {log.name} and the other ranks' logs"}
    with open(out) as f:
        return json.load(f)


def _torchrec(tmp: str) -> dict:
    """TorchRec's runs on the same batches: 1 process x 2 threads, then 2 ranks x 1 thread
    per `--torchrec_sharding`; {"skipped": why} where torchrec is not importable."""
    batches, vocab = kb.make_batches()
    path = os.path.join(tmp, "batches.npz")
    np.savez(
        path,
        dense=np.stack([b[0] for b in batches]),
        cats=np.stack([b[1] for b in batches]),
        label=np.stack([b[2] for b in batches]),
    )
    sizes = ",".join(str(n) for n in kb._table_rows(vocab))
    one = _torchrec_run(tmp, path, sizes, 1, "table_wise")
    if "rates" not in one:
        return one
    result = {"one_process": one["rates"], "torch": one["torch"]}
    for sharding in _TORCHREC_SHARDING.value:
        run = _torchrec_run(tmp, path, sizes, _NUM_WORKERS, sharding)
        result[sharding] = run.get("rates", run)
    return result


def _driver() -> dict:
    from npu_rec import launch

    tmp = tempfile.mkdtemp(prefix="dist_bench_")
    one = os.path.join(tmp, "one.json")
    subprocess.run(
        [sys.executable, __file__, *_flag_args(), f"--dist_out={one}"],
        env=_child_env("one", 2),
        check=True,
        timeout=3600,
        start_new_session=True,
    )
    log = io.BytesIO()
    two = os.path.join(tmp, "worker.json")
    code = launch.run(
        [sys.executable, __file__, *_flag_args(), f"--dist_out={two}"],
        workers=_NUM_WORKERS,
        timeout_secs=3600,
        out=log,
        env=_child_env("worker", 1),
    )
    with open(os.path.join(tmp, "launch.log"), "wb") as f:
        f.write(log.getvalue())
    if code:
        raise SystemExit(f"the two-worker run failed ({code}); its output: {f.name}")
    with open(one) as f:
        one_result = json.load(f)
    workers = []
    for rank in range(_NUM_WORKERS):
        with open(_rank_path(two, rank)) as f:
            workers.append(json.load(f))
    two_result = dict(workers[0])  # rates, bytes and collectives: the same on every worker
    two_result.pop("rank")
    two_result["threads_at_end"] = [w["threads_at_end"] for w in workers]
    two_result["step_split"] = [w["step_split"] for w in workers]
    result = {"one_process": one_result, "two_workers": two_result}
    if _TORCHREC_SHARDING.value:  # in the same sitting, right after npu_rec's pair
        result["torchrec"] = _torchrec(tmp)
    torchrec = result.get("torchrec", {})
    if "failed" not in torchrec and not any(isinstance(v, dict) for v in torchrec.values()):
        shutil.rmtree(tmp, ignore_errors=True)  # kept with the logs of a failed run
    return result


def torchrec_ratios(pairs: list[dict]) -> dict:
    """TorchRec's figures over the pairs: per sharding (2-rank samples/s, ratio to its one
    process, the per-pair ratios), each a median over the pairs; or why there are none."""
    runs = [p["torchrec"] for p in pairs if "torchrec" in p]
    if not runs:
        return {}
    for run in runs:
        if "one_process" not in run:
            return run  # skipped or failed
    ones = [statistics.median(r["one_process"]) for r in runs]
    ratios, failed = {}, {}
    for sharding in _TORCHREC_SHARDING.value:
        if not all(isinstance(r.get(sharding), list) for r in runs):
            failed[sharding] = next(
                r.get(sharding) for r in runs if not isinstance(r.get(sharding), list)
            )
            continue
        twos = [statistics.median(r[sharding]) for r in runs]
        each = [t / o for t, o in zip(twos, ones, strict=True)]
        ratios[sharding] = (statistics.median(twos), statistics.median(each), each)
    return {"one_process": statistics.median(ones), "ratios": ratios, "failed_runs": failed}


def main(argv):
    del argv
    if _ROLE != "driver":
        _run_role(_OUT.value)
        return
    pairs = []
    for _ in range(_PAIRS.value):  # back to back: the machine's load drifts between runs
        pairs.append(_driver())
        pairs[-1]["load_average"] = os.getloadavg()
    results = dict(pairs[-1])
    results["pairs"] = pairs
    ones = [statistics.median(p["one_process"]["rates"]) for p in pairs]
    twos = [statistics.median(p["two_workers"]["rates"]) for p in pairs]
    ratio = statistics.median(t / o for t, o in zip(twos, ones, strict=True))
    one, two = statistics.median(ones), statistics.median(twos)
    nbytes = results["two_workers"]["bytes"]
    print(
        f"batch {kb._BATCH.value}, {kb._STEPS.value} steps x {kb._ROUNDS.value} rounds, "
        f"{kb._IDS.value} distinct ids, "
        f"{'no tables (mlp_only)' if _MLP_ONLY.value else 'one table' if _ONE_TABLE.value else 'one table per feature'}"
    )
    print(f"{'run':<28}{'samples/s':>12}")
    print(f"{'one process x 2 threads':<28}{one:>12.0f}")
    print(
        f"{'2 workers x 1 thread':<28}{two:>12.0f}   ({ratio:.2f}x: median of "
        f"{', '.join(f'{t / o:.2f}' for t, o in zip(twos, ones, strict=True))})"
    )
    print(
        f"bytes sent (= received) per worker per step: sparse {nbytes['sparse'] / 1e6:.2f} MB "
        f"({nbytes['sparse_unpadded'] / 1e6:.2f} MB without padding), "
        f"dense {nbytes['dense'] / 1e6:.2f} MB; at 10 Gb/s: "
        f"{nbytes['total'] / _LINK * 1e3:.1f} ms"
    )
    torchrec = torchrec_ratios(pairs)
    for sharding, (rate, ratio_tr, each) in torchrec.get("ratios", {}).items():
        print(
            f"{'TorchRec, 2 ranks, ' + sharding.replace('_', '-'):<28}{rate:>12.0f}   "
            f"({ratio_tr:.2f}x of its 1 process x 2 threads, "
            f"{torchrec['one_process']:.0f}: median of {', '.join(f'{r:.2f}' for r in each)})"
        )
    for sharding, why in torchrec.get("failed_runs", {}).items():
        print(f"TorchRec, 2 ranks, {sharding}: failed: {why}")
    if "skipped" in torchrec or "failed" in torchrec:
        print(
            f"TorchRec: {'skipped' if 'skipped' in torchrec else 'failed'}: {torchrec.get('skipped') or torchrec.get('failed')}"
        )
    collectives = results["two_workers"]["collectives_per_step"]
    print(
        f"collectives per training step (executed graph): {sum(collectives.values())} "
        f"({', '.join(f'{n} {op}' for op, n in sorted(collectives.items())) or 'none'})"
    )
    print(f"threads per worker at the end: {results['two_workers']['threads_at_end']}")
    if _TRACE_STEPS.value:
        splits = [results["one_process"]["step_split"], *results["two_workers"]["step_split"]]
        print("traced step (ms): step = compute + collectives + rest")
        for who, sp in zip(["one process", "worker 0", "worker 1"], splits, strict=False):
            print(
                f"  {who:<12}{sp['step_ms']:.1f} = {sp['compute_ms']:.1f} + "
                f"{sp['collectives_ms']:.1f} + {sp['rest_ms']:.1f}"
            )
    print(
        "load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    results.update(
        {
            "one_table": _ONE_TABLE.value,
            "mlp_only": _MLP_ONLY.value,
            "load_average": os.getloadavg(),
            "batch_size": kb._BATCH.value,
            "steps": kb._STEPS.value,
            "rounds": kb._ROUNDS.value,
            "distinct_ids": kb._IDS.value,
            "samples_per_sec": {"one_process": one, "two_workers": two},
            "ratio": ratio,
            "torchrec_ratio": {k: v[1] for k, v in torchrec.get("ratios", {}).items()},
        }
    )
    with open(_OUT.value, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
