"""Naming the lost task: `lost_tasks` probes TF_CONFIG addresses, `explain` words the error."""

import json
import socket
import threading
import types

import pytest
import tensorflow as tf

from npu_rec import distribute, launch


@pytest.fixture
def cluster(monkeypatch):
    """TF_CONFIG of worker:0 with a live worker:1 (a listening socket) and a dead worker:2."""
    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen()
    dead_port = launch.free_ports(1)[0]
    me = launch.free_ports(1)[0]
    cluster = {
        "worker": [
            f"127.0.0.1:{me}",
            f"127.0.0.1:{live.getsockname()[1]}",
            f"127.0.0.1:{dead_port}",
        ]
    }
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    yield cluster
    live.close()


def test_lost_tasks_are_those_whose_address_refuses_connections(cluster):
    assert distribute.lost_tasks() == [f"worker:2 ({cluster['worker'][2]})"]


def test_a_collective_failure_becomes_an_error_naming_the_lost_task(cluster):
    err = distribute.explain_peer_error(
        tf.errors.UnavailableError(None, None, "Collective ops is aborted by: recvmsg")
    )
    assert isinstance(err, distribute.WorkerLostError)
    assert f"lost worker task(s) worker:2 ({cluster['worker'][2]})" in str(err)
    assert "re-run the same command" in str(err)
    assert "UnavailableError: Collective ops is aborted by: recvmsg" in str(err)


def test_a_timeout_with_every_task_answering_says_a_worker_is_stalled(cluster, monkeypatch):
    monkeypatch.setattr("npu_rec.distribute._faults.lost_tasks", lambda: [])
    err = distribute.explain_peer_error(tf.errors.DeadlineExceededError(None, None, "timeout"))
    assert "every task still accepts connections" in str(err)


def test_other_errors_and_one_process_runs_are_left_alone(cluster, monkeypatch):
    other = ValueError("bad input")
    assert distribute.explain_peer_error(other) is other
    monkeypatch.delenv("TF_CONFIG")
    lost = tf.errors.UnavailableError(None, None, "x")
    assert distribute.explain_peer_error(lost) is lost


@pytest.mark.parametrize("value", [0, -1, True])
def test_multi_worker_strategy_rejects_a_bad_timeout(value):
    with pytest.raises(ValueError, match=r"`timeout_seconds` must be > 0 \(or None"):
        distribute.multi_worker_strategy(timeout_seconds=value)


class _Runtime:
    """The collective runtime as the watchdog sees it: peer health checks and abort."""

    def __init__(self, silent_task: str):
        self.silent_task = silent_task
        self.checked, self.aborted = [], []

    def check_collective_ops_peer_health(self, task, timeout_in_ms):
        self.checked.append((task, timeout_in_ms))
        if task == self.silent_task:
            raise tf.errors.DeadlineExceededError(None, None, "no answer")

    def abort_collective_ops(self, code, message):
        self.aborted.append((code, message))


def test_the_watchdog_aborts_collectives_naming_a_peer_that_stops_answering(cluster, monkeypatch):
    from npu_rec.distribute import _faults

    runtime = _Runtime("/job:worker/replica:0/task:1")
    monkeypatch.setattr(_faults, "context", types.SimpleNamespace(context=lambda: runtime))
    peers = [("worker", 1, cluster["worker"][1]), ("worker", 2, cluster["worker"][2])]
    dog = _faults.Watchdog(0.4, peers)
    assert dog.interval == dog.probe_seconds == 0.1  # interval + 2 probes < the bound
    dog.start()
    dog._thread.join(5)
    assert not dog.running
    assert runtime.checked[:2] == [("/job:worker/replica:0/task:1", 100)] * 2  # retried once
    [(code, message)] = runtime.aborted
    assert code == tf.errors.UNAVAILABLE
    assert f"worker task worker:1 ({cluster['worker'][1]}) stopped answering" in message
    assert dog.silent == [f"worker:1 ({cluster['worker'][1]})"]

    # The step that fails then names the silent task even though it accepts connections.
    monkeypatch.setattr(_faults, "lost_tasks", lambda: [])
    monkeypatch.setattr(_faults, "_WATCHDOG", dog)
    err = distribute.explain_peer_error(tf.errors.UnavailableError(None, None, message))
    assert f"lost worker task(s) worker:1 ({cluster['worker'][1]}): they still accept" in str(err)
    assert "stopped answering" in str(err)


def test_a_watchdog_whose_peers_answer_keeps_probing_until_stopped(cluster, monkeypatch):
    from npu_rec.distribute import _faults

    runtime = _Runtime("nobody")
    monkeypatch.setattr(_faults, "context", types.SimpleNamespace(context=lambda: runtime))
    dog = _faults.Watchdog(0.2, [("worker", 1, cluster["worker"][1])]).start()
    for _ in range(100):
        if len(runtime.checked) >= 3:
            break
        threading.Event().wait(0.05)
    dog.stop()
    assert not dog.running
    assert len(runtime.checked) >= 3 and not runtime.aborted and not dog.silent
