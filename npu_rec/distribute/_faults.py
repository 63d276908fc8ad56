"""Naming the lost worker when a collective fails.

A collective whose peer died fails with `UnavailableError` (the peer's
connection was reset) or, when the peer hangs, `DeadlineExceededError` once
the strategy's timeout passes (`multi_worker_strategy(timeout_seconds=...)`).
TensorFlow's message names the collective, rarely the task. `explain` probes
every other task of `TF_CONFIG` with a TCP connection: a dead process's port
refuses it. The error raised then names the tasks that no longer answer.
"""

from __future__ import annotations

import json
import os
import socket

import tensorflow as tf

#: Collective failures that mean "a peer is gone or stalled".
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.InternalError,
)
_PROBE_SECS = 2.0


class WorkerLostError(RuntimeError):
    """A worker of a multi-worker run died or stalled; every worker stops."""


def lost_tasks(tf_config: str | None = None, probe_secs: float = _PROBE_SECS) -> list[str]:
    """`job:index (address)` of each other task in `TF_CONFIG` that refuses connections."""
    config = json.loads(tf_config if tf_config is not None else os.environ.get("TF_CONFIG", "{}"))
    me = config.get("task", {})
    lost = []
    for job, addresses in config.get("cluster", {}).items():
        for index, address in enumerate(addresses):
            if job == me.get("type") and index == me.get("index"):
                continue
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=probe_secs).close()
            except OSError:
                lost.append(f"{job}:{index} ({address})")
    return lost


def explain(err: Exception) -> Exception:
    """A `WorkerLostError` naming the lost tasks for a collective failure, else `err`."""
    if not isinstance(err, PEER_ERRORS) or "TF_CONFIG" not in os.environ:
        return err
    lost = lost_tasks()
    if lost:
        who = (
            f"lost worker task(s) {', '.join(lost)}: their address no longer accepts "
            "connections (the process died)"
        )
    else:
        who = (
            "a collective failed or timed out while every task still accepts connections "
            "(a worker is stalled, or the network dropped)"
        )
    return WorkerLostError(
        f"npu_rec: {who}. This worker stops too; re-run the same command on every task to "
        f"resume from the last checkpoint. Cause: {type(err).__name__}: "
        f"{(err.message if hasattr(err, 'message') else str(err)).strip()[:600]}"
    )
