"""Progress bars, the metric log, TensorBoard events, the PNG report and the summary."""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from tqdm import tqdm

from npu_rec._paths import atomic_file


def peak_memory_mb() -> float:
    """Peak resident memory of this process, MiB (`resource.getrusage`, Linux: KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def window_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (ties averaged); NaN when one class is missing."""
    labels = np.asarray(labels).ravel() > 0.5
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = np.asarray(scores).ravel()[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


class MetricLog:
    """Training loss and AUC per step, plus throughput, shared by both front ends.

    Args:
      batch_size: examples per step.
      total: the global step the run stops at (for the progress bar).
      start: the global step the run starts at.
      verbose: show a tqdm progress bar with steps/s and samples/s.
    """

    def __init__(self, batch_size: int, total: int, start: int, verbose: int):
        self.batch_size = batch_size
        self.steps: list[int] = []
        self.loss: list[float] = []
        self.auc: list[float] = []
        self.start = start
        self._bar = tqdm(
            total=total,
            initial=start,
            unit="step",
            dynamic_ncols=True,
            disable=not verbose,
            file=sys.stderr,
        )
        self._t0 = None
        self._t_first = None
        self.seconds = 0.0

    def record(self, step: int, loss: float, auc: float | None = None) -> None:
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        elif self._t_first is None:
            self._t_first = now  # the first step traces the graph: not timed
        self.steps.append(int(step))
        self.loss.append(float(loss))
        self.auc.append(float("nan") if auc is None else float(auc))
        if self._t_first is not None:
            timed = len(self.steps) - 2
            self.seconds = now - self._t_first
            rate = timed / self.seconds if self.seconds > 0 and timed > 0 else 0.0
            self._bar.set_postfix_str(
                f"loss={loss:.4f} {rate:.1f} steps/s {rate * self.batch_size:.0f} samples/s",
                refresh=False,
            )
        self._bar.update(max(0, int(step) - self._bar.n))

    @property
    def samples_per_sec(self) -> float:
        timed = len(self.steps) - 2
        return timed * self.batch_size / self.seconds if timed > 0 and self.seconds > 0 else 0.0

    def close(self) -> None:
        self._bar.close()

    def write_events(self, log_dir: str) -> str:
        """TensorBoard scalars `train/loss` and `train/auc` per step under `log_dir`."""
        # tf.summary.write, not tf.summary.scalar: the latter needs the tensorboard package.
        meta = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        writer = tf.summary.create_file_writer(log_dir)
        with writer.as_default():
            for s, lo, au in zip(self.steps, self.loss, self.auc, strict=True):
                tf.summary.write("train/loss", tf.constant(lo, tf.float32), step=s, metadata=meta)
                if not np.isnan(au):
                    tf.summary.write(
                        "train/auc", tf.constant(au, tf.float32), step=s, metadata=meta
                    )
        writer.flush()
        writer.close()
        return log_dir


class KerasProgress(keras.callbacks.Callback):
    """Feeds a `MetricLog` from Keras batch logs (loss and AUC are running means)."""

    def __init__(self, log: MetricLog):
        super().__init__()
        self.log = log

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        self.log.record(self.model.global_step, logs.get("loss", float("nan")), logs.get("auc"))


def write_report(path: str, log: MetricLog, title: str) -> str:
    """A PNG of training loss and AUC over steps (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(log.steps, log.loss)
    ax1.set(xlabel="step", ylabel="train loss", title="loss")
    auc = np.asarray(log.auc)
    ok = ~np.isnan(auc)
    ax2.plot(np.asarray(log.steps)[ok], auc[ok])
    ax2.set(xlabel="step", ylabel="train AUC", title="AUC")
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def print_summary(metrics: dict) -> None:
    """The final summary: one `key=value` line (stable, greppable), the table sizes and memory."""
    print(
        f"eval_loss={metrics['eval_loss']:.4f} eval_auc={metrics['eval_auc']:.4f} "
        f"samples_per_sec={metrics['samples_per_sec']:.0f} "
        f"train_seconds={metrics['train_seconds']:.1f} "
        f"peak_memory_mb={metrics['peak_memory_mb']:.0f} global_step={metrics['global_step']}",
        flush=True,
    )
    sizes = metrics.get("table_sizes") or {}
    if sizes:
        rows = sum(sizes.values())
        print(
            f"tables: {len(sizes)}, rows: {rows}; largest: "
            + ", ".join(f"{k}={v}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:3]),
            flush=True,
        )
    for name, stats in sorted((metrics.get("table_memory") or {}).items()):
        if stats:
            print(f"table {name} memory: {memory_line(stats)}", flush=True)


def memory_line(stats: dict) -> str:
    """One line of a `memory_stats` dict: MiB of each part and bytes per live key."""
    mib = 1 << 20
    parts = " ".join(
        f"{k}={stats[k] / mib:.1f}MiB"
        for k in ("rows", "slots", "metadata", "index", "fallback")
        if k in stats and (stats[k] or k != "fallback")  # no fallback: not printed
    )
    return (
        f"live_keys={stats['live_keys']} {parts} "
        f"bytes_per_live_key={stats['bytes_per_live_key']:.1f}"
    )


def write_metrics(model_dir: str, metrics: dict) -> str:
    """Publishes metrics.json atomically: a crash or a full disk leaves the old file or the new."""
    path = os.path.join(model_dir, "metrics.json")
    with atomic_file(path) as f:
        json.dump(metrics, f, indent=2)
    return path
