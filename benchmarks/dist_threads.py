"""Threads per worker over a long 2-worker run: the count must stay flat after warm-up.

A collective that runs with a timeout leaves threads alive until the timeout
passes, so a run that makes many collectives per second runs out of threads
("Resource temporarily unavailable"). This trains the DLRM-shaped model of
`keras_bench.py` in miniature (`--tables` categorical features, each its own
`SparseEmbedding` table of width 4, 13 dense features, a small MLP) on small
batches under `npu_rec.distribute.multi_worker_strategy()` with 2 workers
started by `npu_rec.launch`, and reads each worker's thread count
(`Threads:` of /proc/self/status) every `--every` steps.

  python benchmarks/dist_threads.py                 # 5,000 steps (about 10 min on 2 cores)
  python benchmarks/dist_threads.py --short         # 300 steps, what the test runs

`--stall_at N` checks the other side of the same mechanism instead: worker 1 stops
itself (SIGSTOP) after step N, and worker 0 must fail within the watchdog's bound
(`--bound_secs`) with `WorkerLostError` naming worker:1 (it prints
`LOST <seconds after the stall> <message>`).

Prints, per worker, the thread count after warm-up (step `--warmup`) and the
highest count after it, and exits 1 when a worker's count grew by more than
`--slack` threads. Writes JSON with every sample to `--out`
(benchmarks/results/dist_threads.json unless told otherwise).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKER = "TF_CONFIG" in os.environ
if _WORKER:  # the strategy comes before any other TensorFlow op
    sys.path.insert(0, _ROOT)
    import npu_rec.distribute

    _BOUND = "--bound_secs" in sys.argv and float(sys.argv[sys.argv.index("--bound_secs") + 1])
    _STRATEGY = npu_rec.distribute.multi_worker_strategy(
        **({"timeout_seconds": _BOUND} if _BOUND else {})
    )


def threads() -> int:
    """This process's thread count (Python and native), from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads: line in /proc/self/status")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5000, help="training steps")
    p.add_argument("--short", action="store_true", help="300 steps (overrides --steps)")
    p.add_argument("--tables", type=int, default=26, help="categorical features (one table each)")
    p.add_argument("--batch_size", type=int, default=32, help="global batch size")
    p.add_argument("--every", type=int, default=10, help="read the thread count every N steps")
    p.add_argument("--warmup", type=int, default=50, help="steps before the reference count")
    p.add_argument("--slack", type=int, default=8, help="threads a worker may gain after warm-up")
    p.add_argument("--timeout_secs", type=float, default=3600, help="launcher time limit")
    p.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "dist_threads.json"
        ),
        help="JSON output path ('' for none)",
    )
    p.add_argument("--stall_at", type=int, default=0, help="worker 1 stops itself after step N")
    p.add_argument("--bound_secs", type=float, default=60, help="watchdog bound (seconds)")
    args = p.parse_args(argv)
    if args.short:
        args.steps = 300
    return args


def _train(args) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    import npu_rec
    from npu_rec.keras import RecModel, SparseEmbedding

    rng = np.random.default_rng(3)
    n = 4096
    cats = (rng.zipf(1.3, (n, args.tables)) % 50000).astype(np.int64)
    dense = rng.normal(size=(n, 13)).astype(np.float32)
    label = (cats[:, 0] % 2 == 0).astype(np.float32)[:, None]
    features = {f"c{t}": cats[:, t] for t in range(args.tables)}
    features["num"] = dense
    ds = tf.data.Dataset.from_tensor_slices((features, label)).batch(args.batch_size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = ds.with_options(options).repeat()

    with _STRATEGY.scope():
        inputs = {
            f"c{t}": keras.Input(shape=(), dtype="int64", name=f"c{t}") for t in range(args.tables)
        }
        inputs["num"] = keras.Input(shape=(13,), dtype="float32", name="num")
        embedded = [
            SparseEmbedding(f"t{t}", 4, optimizer=npu_rec.optimizers.Adagrad(0.05))(inputs[f"c{t}"])
            for t in range(args.tables)
        ]
        x = keras.layers.Concatenate()([*embedded, keras.layers.Dense(8)(inputs["num"])])
        x = keras.layers.Dense(16, activation="relu")(x)
        model = RecModel(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
        model.compile(optimizer="adam", loss="binary_crossentropy")

    rank = npu_rec.distribute.worker_rank(_STRATEGY)
    samples = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % args.every == 0:
                samples.append((batch + 1, threads()))
            if rank == 1 and batch + 1 == args.stall_at:
                with open(_stall_file(), "w") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGSTOP)

    try:
        model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[Count()])
    except npu_rec.distribute.WorkerLostError as err:
        with open(_stall_file()) as f:
            stalled = float(f.read())
        print(f"LOST {time.time() - stalled:.1f} {err}", flush=True)
        sys.exit(3)
    print("THREADS " + json.dumps({"rank": rank, "samples": samples}), flush=True)


def _stall_file() -> str:
    return os.path.join(os.environ["DIST_THREADS_DIR"], "stalled")


def _drive(args) -> int:
    from npu_rec import launch

    env = {**os.environ, "PYTHONPATH": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    out = io.BytesIO()
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    with tempfile.TemporaryDirectory() as directory:
        env["DIST_THREADS_DIR"] = directory
        code = launch.run(argv, workers=2, timeout_secs=args.timeout_secs, out=out, env=env)
    log = out.getvalue().decode()
    if args.stall_at:
        lost = [line for line in log.splitlines() if "] LOST " in line]
        print("\n".join(lost) if lost else log[-6000:])
        return 0 if code == 3 and lost else 1
    if code != 0:
        print(log[-6000:])
        return code
    runs = {}
    for line in log.splitlines():
        head, _, body = line.partition("THREADS ")
        if body:
            run = json.loads(body)
            runs[run["rank"]] = run["samples"]
    grown = False
    report = {"steps": args.steps, "tables": args.tables, "warmup": args.warmup, "workers": {}}
    for rank in sorted(runs):
        after = [count for step, count in runs[rank] if step >= args.warmup]
        base, peak = after[0], max(after)
        grown |= peak - base > args.slack
        report["workers"][rank] = {"after_warmup": base, "max": peak, "samples": runs[rank]}
        print(
            f"worker {rank}: {base} threads after {args.warmup} steps, at most {peak} up to step {args.steps}"
        )
    if len(runs) != 2:
        print(log[-6000:])
        return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if grown else 0


def main(argv=None) -> int:
    args = _parse(argv)
    if _WORKER:
        _train(args)
        return 0
    return _drive(args)


if __name__ == "__main__":
    sys.exit(main())
