"""Latency and bandwidth of the exchange's raw collectives between local workers.

Run under `python -m npu_rec.launch --workers 2 benchmarks/collective_probe.py`:
each worker times chains of `--chain` dependent `CollectiveAllToAllV2` ops
(each worker sends `bytes / W` to every worker) for payloads from 1 KB to 4 MB, and
of the size exchange (an all-to-all of W int32 to every worker), through
`npu_rec.distribute.Exchange`. Worker 0 prints the median ms per collective and the
fit `latency + bytes / bandwidth` (least squares) of the all-to-all, and a ring `CollectiveReduceV2` of the same
payloads for comparison: the terms of the scaling model of
docs/distributed.md.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import npu_rec.distribute  # noqa: E402

STRATEGY = npu_rec.distribute.multi_worker_strategy(timeout_seconds=120)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from npu_rec.distribute import _exchange  # noqa: E402

CHAIN = int(os.environ.get("PROBE_CHAIN", "20"))
SIZES = (1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20)


def main() -> None:
    workers = STRATEGY.num_replicas_in_sync
    rank = npu_rec.distribute.worker_rank(STRATEGY)
    exchange = _exchange.Exchange(workers, rank)

    def chain_fn(n_floats: int):
        site = _exchange.next_site()
        sizes_site = _exchange.next_site()

        @tf.function
        def run():
            def step():
                x = tf.ones([workers, n_floats // workers])
                for _ in range(CHAIN):
                    x = exchange.all_to_all(x, site, tf.constant(0)) + 1.0
                return x[0, 0]

            return STRATEGY.run(step)

        @tf.function
        def sizes():
            def step():
                c = tf.ones([workers], tf.int32)
                for _ in range(CHAIN):
                    c = exchange.gather_sizes(c, sizes_site)[0] + 1
                return c[0]

            return STRATEGY.run(step)

        reduce_site = _exchange.next_site()

        @tf.function
        def reduce():
            def step():
                x = tf.ones([n_floats])
                for _ in range(CHAIN):
                    x = tf.raw_ops.CollectiveReduceV2(
                        input=x,
                        group_size=workers,
                        group_key=_exchange.GROUP_KEY,
                        instance_key=reduce_site,
                        ordering_token=[],
                        merge_op="Add",
                        final_op="Id",
                        communication_hint="ring",
                        timeout_seconds=0,
                    ) * (1.0 / workers)
                return x[0]

            return STRATEGY.run(step)

        return run, sizes, reduce

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) / CHAIN)
        return statistics.median(times)

    rows, reduces = [], []
    for nbytes in SIZES:
        run, sizes, reduce = chain_fn(nbytes // 4)
        rows.append((nbytes, timed(run)))
        reduces.append((nbytes, timed(reduce)))
    gather_time = timed(sizes)
    if rank == 0:
        x = np.array([b for b, _ in rows], float) * (workers - 1) / workers  # bytes on the wire
        y = np.array([t for _, t in rows])
        slope, intercept = np.polyfit(x, y, 1)
        for (nbytes, t), (_, r) in zip(rows, reduces, strict=True):
            print(
                f"{nbytes >> 10:>6} KB: all-to-all {t * 1e3:.2f} ms, ring all-reduce "
                f"{r * 1e3:.2f} ms",
                flush=True,
            )
        print(f"size exchange ({workers} int32 to every worker): {gather_time * 1e3:.2f} ms")
        print(
            f"fit: latency {intercept * 1e3:.2f} ms + bytes / {1 / slope / 1e9:.2f} GB/s "
            f"(load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
