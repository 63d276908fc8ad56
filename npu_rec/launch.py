r"""Starts a multi-worker npu_rec job on one machine, each task with its own `TF_CONFIG`.

    python -m npu_rec.launch --workers 2 -m npu_rec.scripts.train --max_steps=100
    python -m npu_rec.launch --workers 2 --ps 1 --chief -m my_package.train --flag=1

Each task is one process of the same program, started with `TF_CONFIG`
(`{"cluster": {...}, "task": {"type": ..., "index": ...}}`) naming free
127.0.0.1 ports, in its own process group. Their output is merged line by
line, each line prefixed with the task (`[worker:1] ...`). The launcher:

* returns 0 when every worker (and the chief) exits 0; `ps` tasks serve until
  then and are stopped;
* when a task fails (non-zero exit, or killed by a signal), waits up to
  `--grace_secs` for the others to exit on their own (their lost-worker
  error names the lost peer), then stops every process group that is left
  (SIGTERM, then SIGKILL after 5 s), and returns the failing task's exit code
  (128 + signal number for a task killed by a signal);
* after `--timeout_secs` stops everything and returns 124 (as `timeout(1)`);
* on SIGINT/SIGTERM stops everything and returns 130 / 143.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from npu_rec import _log as logging

TIMEOUT_EXIT = 124
_KILL_AFTER_SECS = 5.0
_POLL_SECS = 0.1


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free on `host` now (all sockets are held until every port is chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_spec(
    workers: int, ps: int = 0, chief: bool = False, host: str = "127.0.0.1"
) -> dict[str, list[str]]:
    """A `TF_CONFIG` cluster of addresses on free ports of `host`.

    An evaluator task is never part of the cluster (tf.estimator's rule).
    """
    counts = {"chief": int(chief), "worker": workers, "ps": ps}
    ports = iter(free_ports(sum(counts.values()), host))
    cluster = {job: [f"{host}:{next(ports)}" for _ in range(n)] for job, n in counts.items() if n}
    return cluster


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    """The `TF_CONFIG` JSON of one task."""
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _tasks(cluster: dict[str, list[str]], evaluator: bool) -> list[tuple[str, int]]:
    order = ["chief", "worker", "ps"]
    tasks = [(job, i) for job in order for i in range(len(cluster.get(job, ())))]
    if evaluator:
        tasks.append(("evaluator", 0))
    return tasks


class _Task:
    """One running task: its process (own process group) and the thread copying its output."""

    def __init__(
        self,
        job: str,
        index: int,
        command: Sequence[str],
        env: dict[str, str],
        out,
        lock: threading.Lock,
    ):
        self.name = f"{job}:{index}"
        self.job = job
        self.proc = subprocess.Popen(
            list(command),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._copy, args=(out, lock), daemon=True)
        self._reader.start()

    def _copy(self, out, lock: threading.Lock) -> None:
        prefix = f"[{self.name}] ".encode()
        for line in iter(self.proc.stdout.readline, b""):
            with lock:
                out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                out.flush()
        self.proc.stdout.close()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def join_output(self, timeout: float = 5.0) -> None:
        self._reader.join(timeout)


def exit_code(returncode: int) -> int:
    """A shell-style exit code: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(tasks: list[_Task]) -> None:
    """SIGTERM to every live task's process group, SIGKILL to those left after 5 s."""
    live = [t for t in tasks if t.proc.poll() is None]
    for t in live:
        t.signal(signal.SIGTERM)
    deadline = time.monotonic() + _KILL_AFTER_SECS
    while time.monotonic() < deadline and any(t.proc.poll() is None for t in live):
        time.sleep(_POLL_SECS)
    for t in tasks:  # also the groups of tasks that exited but left children behind
        t.signal(signal.SIGKILL)
    for t in tasks:
        t.proc.wait()
        t.join_output()


def run(
    command: Sequence[str],
    *,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    timeout_secs: float | None = None,
    grace_secs: float = 0.0,
    out=None,
    env: dict[str, str] | None = None,
) -> int:
    """Runs `command` once per task with its `TF_CONFIG`; returns the job's exit code.

    Args:
      command: The program and its arguments, e.g. `[sys.executable, "train.py", "--x=1"]`.
      workers: Number of `worker` tasks (>= 1).
      ps: Number of `ps` tasks (>= 0); they are stopped once the workers finish. A
        cluster with ps tasks always has a chief (added, and said, when `chief` is False).
      chief: Add a `chief` task.
      evaluator: Add an `evaluator` task (outside the cluster spec, as in tf.estimator).
      timeout_secs: Stop everything and return 124 after this many seconds (None: no limit).
      grace_secs: After a task fails, how long the others may take to exit on their own.
      out: Binary stream for the prefixed output (default: stdout's buffer).
      env: Base environment (default: `os.environ`).

    Returns:
      0 when every worker and the chief exit 0; the first failing task's exit code;
      124 on timeout.

    Raises:
      ValueError: `workers`, `ps`, `timeout_secs` or `grace_secs` out of range, or an
        empty `command`.
    """
    _validate(command, workers, ps, timeout_secs, grace_secs)
    out = out if out is not None else sys.stdout.buffer
    lock = threading.Lock()
    if ps and not chief:  # tf.estimator's and the ps route's clusters need exactly one chief
        chief = True
        _say(out, lock, f"{ps} ps task(s) need a chief task: adding chief:0 (as --chief does)")
    cluster = cluster_spec(workers, ps, chief)
    tasks: list[_Task] = []
    base = dict(os.environ if env is None else env)
    previous = _forward_signals(tasks)
    try:
        for job, index in _tasks(cluster, evaluator):
            task_env = {**base, "TF_CONFIG": tf_config(cluster, job, index)}
            tasks.append(_Task(job, index, command, task_env, out, lock))
        return _watch(tasks, timeout_secs, grace_secs, out, lock)
    finally:
        _stop(tasks)
        _restore_signals(previous)


def _validate(command, workers, ps, timeout_secs, grace_secs) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"`workers` must be an integer >= 1. Received: workers={workers!r}")
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise ValueError(f"`ps` must be an integer >= 0. Received: ps={ps!r}")
    if timeout_secs is not None and not timeout_secs > 0:
        raise ValueError(
            "`timeout_secs` must be > 0 (or None for no limit). "
            f"Received: timeout_secs={timeout_secs!r}"
        )
    if not grace_secs >= 0:
        raise ValueError(f"`grace_secs` must be >= 0. Received: grace_secs={grace_secs!r}")
    if not command:
        raise ValueError("`command` must name the program to run. Received: command=[]")


def _say(out, lock: threading.Lock, text: str) -> None:
    with lock:
        out.write(f"[launch] {text}\n".encode())
        out.flush()


def _watch(tasks: list[_Task], timeout_secs, grace_secs, out, lock) -> int:
    """Waits for the job to finish, fail or time out; returns its exit code."""
    start = time.monotonic()
    failed: _Task | None = None
    failed_at = 0.0
    needed = [t for t in tasks if t.job != "ps"]
    while True:
        now = time.monotonic()
        if failed is None:
            for t in tasks:
                code = t.proc.poll()
                if code not in (None, 0):
                    failed, failed_at = t, now
                    _say(
                        out,
                        lock,
                        f"task {t.name} failed with exit code {exit_code(code)}; "
                        f"stopping the other tasks"
                        + (f" after up to {grace_secs:g} s" if grace_secs else ""),
                    )
                    break
            else:
                if all(t.proc.poll() == 0 for t in needed):
                    return 0
        if failed is not None and (
            now - failed_at >= grace_secs or all(t.proc.poll() is not None for t in needed)
        ):
            return exit_code(failed.proc.returncode)
        if timeout_secs is not None and now - start > timeout_secs:
            live = [t.name for t in tasks if t.proc.poll() is None]
            _say(out, lock, f"time limit of {timeout_secs:g} s reached; stopping {live}")
            return TIMEOUT_EXIT
        time.sleep(_POLL_SECS)


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.code = 128 + signum


def _forward_signals(tasks: list[_Task]):
    """SIGINT/SIGTERM raise `_Interrupted` in the main thread (so `run` stops the tasks)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise _Interrupted(signum)

    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(previous) -> None:
    for s, h in (previous or {}).items():
        signal.signal(s, h)


#: Set to 1 to see the traceback of the launcher's own errors.
TRACEBACK_ENV = "NPU_REC_TRACEBACK"


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line: `npu_rec: error: <message>` (exit status 2)."""

    def error(self, message):
        sys.stderr.write(f"npu_rec: error: {message} (--help lists the options)\n")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m npu_rec.launch",
        description="Runs a program once per task of a local TF_CONFIG cluster.",
        epilog=f"An error of the launcher prints one line, `npu_rec: error: ...`; "
        f"{TRACEBACK_ENV}=1 in the environment prints its traceback too.",
    )
    p.add_argument("--workers", type=int, default=2, help="worker tasks (default 2)")
    p.add_argument(
        "--ps",
        type=int,
        default=0,
        help="parameter-server tasks (default 0); a chief task is added with them",
    )
    p.add_argument("--chief", action="store_true", help="add a chief task")
    p.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    p.add_argument(
        "--timeout_secs",
        type=float,
        default=None,
        help="stop every task after this many seconds and exit 124",
    )
    p.add_argument(
        "--grace_secs",
        type=float,
        default=0.0,
        help="after a task fails, let the others exit on their own this long",
    )
    p.add_argument("-m", dest="module", default=None, help="run a module (as python -m)")
    p.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="script.py [args...] (or the module's args with -m)",
    )
    return p


_VALUE_OPTIONS = ("--workers", "--ps", "--timeout_secs", "--grace_secs")


def _split_module_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The launcher's arguments up to `-m MODULE`, and the module's own after it.

    As with `python -m`, everything after the module's name is the module's (argparse
    would read a module's `--flag=1` as one of the launcher's options).
    """
    argv = list(argv)
    i = 0
    while i < len(argv):
        if argv[i] == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if not argv[i].startswith("-"):  # the script: the rest is its arguments
            break
        i += 2 if argv[i] in _VALUE_OPTIONS else 1
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    own, module_args = _split_module_args(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    if args.module is not None:
        command = [sys.executable, "-m", args.module, *args.program, *module_args]
    elif args.program:
        command = [sys.executable, *args.program]
    else:
        _parser().error("name a script (script.py [args...]) or a module (-m module)")
    try:
        return run(
            command,
            workers=args.workers,
            ps=args.ps,
            chief=args.chief,
            evaluator=args.evaluator,
            timeout_secs=args.timeout_secs,
            grace_secs=args.grace_secs,
        )
    except ValueError as err:
        _parser().error(str(err))
    except _Interrupted as stop:
        logging.warning("npu_rec.launch: interrupted; every task was stopped.")
        return stop.code
    except Exception as err:  # e.g. OSError: a task's program cannot start
        if os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
            raise
        sys.stderr.write(f"npu_rec: error: {' '.join(str(err).split())}\n")
        return 1
    return 1  # not reached: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
