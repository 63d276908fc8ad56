"""No thread per collective, and a stalled worker still fails the other naming it.

Both run `benchmarks/dist_threads.py` (2 workers through `npu_rec.launch`, a table per
feature, small batches) in a subprocess with its own process group and a hard time
limit. A collective with a timeout keeps a thread alive until its timeout passes
(tens of threads per step here), so the count must stay flat after warm-up; the
lost-worker bound comes from the process's watchdog instead.
"""

import os
import re
import subprocess
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_ROOT, "benchmarks", "dist_threads.py")


def _run(*args, timeout):
    env = {**os.environ, "PYTHONPATH": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, _SCRIPT, *args],
        env=env,
        capture_output=True,
        timeout=timeout,
        start_new_session=True,
    )
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


@pytest.mark.timeout(300)
def test_two_workers_keep_a_flat_thread_count_after_warm_up(tmp_path):
    code, log = _run(
        "--steps", "100", "--tables", "6", "--every", "10", "--warmup", "30",
        "--timeout_secs", "240", "--out", str(tmp_path / "threads.json"), timeout=260,
    )  # fmt: skip
    counts = re.findall(r"worker (\d): (\d+) threads after 30 steps, at most (\d+)", log)
    assert sorted(rank for rank, _, _ in counts) == ["0", "1"], log[-6000:]
    for _, after_warmup, peak in counts:
        # 12+ collectives per step: a thread per collective would add thousands.
        assert int(peak) - int(after_warmup) <= 8, log[-6000:]
    assert code == 0, log[-6000:]


@pytest.mark.timeout(300)
def test_a_stopped_worker_fails_the_other_within_the_bound_naming_it():
    code, log = _run(
        "--steps", "200", "--tables", "2", "--stall_at", "10", "--bound_secs", "10",
        "--timeout_secs", "240", timeout=260,
    )  # fmt: skip
    lost = re.search(r"\[worker:0\] LOST (\S+) (.*)", log)
    assert code == 0 and lost, log[-6000:]
    assert float(lost.group(1)) < 10 + 5  # the bound, plus the step that notices
    assert "lost worker task(s) worker:1 (127.0.0.1:" in lost.group(2)
    assert "stopped answering" in lost.group(2)
    assert "re-run the same command" in lost.group(2)
