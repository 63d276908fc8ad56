"""Failing every worker, naming the lost one, when a worker dies or stalls.

Collectives run without a timeout: TensorFlow implements a collective's
timeout with a sleeping thread per collective that lives until the timeout
passes, so a run making hundreds of collectives a second would run out of
threads. Instead one `Watchdog` thread per process asks every other task of
the collective group whether it still answers (TensorFlow's collective peer
health check, an RPC with a deadline) every few seconds; when one does not,
it aborts this process's collectives (`abort_collective_ops`), so the step
waiting on the lost peer fails with `UnavailableError` naming it. A dead
peer usually breaks the step sooner on its own: its connection is reset.

TensorFlow's message names the collective, rarely the task. `explain` probes
every other task of `TF_CONFIG` with a TCP connection: a dead process's port
refuses it. The error raised then names the tasks that no longer answer (or,
for a stalled task that still accepts connections, the task the watchdog
found silent).
"""

from __future__ import annotations

import json
import os
import socket
import threading

import tensorflow as tf
from tensorflow.python.eager import context

from npu_rec import _log as logging

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
    silent = _WATCHDOG.silent if _WATCHDOG is not None else []
    if lost:
        who = (
            f"lost worker task(s) {', '.join(lost)}: their address no longer accepts "
            "connections (the process died)"
        )
    elif silent:
        who = (
            f"lost worker task(s) {', '.join(silent)}: they still accept connections but "
            "stopped answering (stalled, or the network dropped)"
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


class Watchdog:
    """One thread per process that aborts its collectives when a peer stops answering.

    Every `interval` seconds it runs TensorFlow's collective peer health check
    on each other task of the group (`context.check_collective_ops_peer_health`,
    one RPC with a deadline); a task that fails twice in a row is lost: the
    watchdog logs it, records it in `silent`, aborts this process's collectives
    with `UnavailableError` naming it, and stops. A lost or stalled worker thus
    fails the others within about `bound_seconds`, and no collective needs a
    timeout (which costs a thread per collective).

    Args:
      bound_seconds: Seconds within which a lost peer fails this worker's step.
      peers: `(job, index, address)` of every other task of the collective group.
    """

    def __init__(self, bound_seconds: float, peers: list[tuple[str, int, str]]):
        self.bound_seconds = float(bound_seconds)
        self.peers = list(peers)
        # One interval plus two probes with their deadlines take 3/4 of the bound,
        # leaving the rest for the waiting step to fail.
        self.probe_seconds = self.bound_seconds / 4
        self.interval = min(self.bound_seconds / 4, _MAX_INTERVAL_SECS)
        self.silent: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="npu_rec-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops probing (waits for a probe in flight)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _answers(self, job: str, index: int) -> bool:
        for _ in range(2):
            try:
                context.context().check_collective_ops_peer_health(
                    f"/job:{job}/replica:0/task:{index}",
                    timeout_in_ms=max(1, int(self.probe_seconds * 1000)),
                )
                return True
            except (
                tf.errors.UnavailableError,
                tf.errors.FailedPreconditionError,  # the peer restarted
                tf.errors.DeadlineExceededError,
            ):
                if self._stop.is_set():
                    return True
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for job, index, address in self.peers:
                if self._stop.is_set():
                    return
                if not self._answers(job, index):
                    self.silent.append(f"{job}:{index} ({address})")
                    message = (
                        f"npu_rec: worker task {job}:{index} ({address}) stopped answering "
                        f"within {self.probe_seconds:g} s, twice; aborting this worker's "
                        "collectives so that the step waiting on it fails"
                    )
                    logging.warning("%s", message)
                    context.context().abort_collective_ops(tf.errors.UNAVAILABLE, message)
                    return


_MAX_INTERVAL_SECS = 5.0
_WATCHDOG: Watchdog | None = None
_WATCHDOG_LOCK = threading.Lock()


def watch_peers(bound_seconds: float, cluster: dict, task_type: str, task_id: int) -> Watchdog:
    """Starts this process's `Watchdog` over the chief and workers of `cluster` (once).

    Args:
      bound_seconds: Seconds within which a lost peer fails this worker's step.
      cluster: `{job: [address, ...]}` (a cluster spec's `as_dict()`).
      task_type, task_id: This task.

    Returns:
      The process's watchdog; a second call returns the first one's.
    """
    global _WATCHDOG
    with _WATCHDOG_LOCK:
        if _WATCHDOG is None or not _WATCHDOG.running and not _WATCHDOG.silent:
            peers = [
                (job, index, address)
                for job in ("chief", "worker")
                for index, address in enumerate(cluster.get(job, []))
                if (job, index) != (task_type, int(task_id))
            ]
            _WATCHDOG = Watchdog(bound_seconds, peers).start()
        return _WATCHDOG


def watchdog() -> Watchdog | None:
    """This process's watchdog, or None when none was started."""
    return _WATCHDOG
