"""The short exactly-once campaign: a SIGKILL while each front end trains from a Kafka topic
of seven rows per message (a batch of 32 rows ends inside a message, so saves and restarts
land there). Every check made with one row per message (each row trained once, the restart
at its checkpoint's position, the broker's offsets not ahead) is made here too; the one-row
topic itself, where no save can fall inside a message, is left to the long campaign."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("confluent_kafka")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 32
STEPS = 64  # the short mode's steps


def _campaigns(tmp_path, frontends, timeout):
    """The short campaign of each front end, in processes of their own (and brokers of their
    own) running side by side; each must succeed. Returns the results of all."""
    procs = {}
    for f in frontends:
        with (tmp_path / f"{f}.log").open("wb") as log:  # a file: no pipe to fill up
            procs[f] = subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(ROOT, "benchmarks", "kafka_exactly_once.py"),
                    "--mode=short",
                    f"--frontends={f}",
                    "--rows_per_message=7",
                    f"--work_dir={tmp_path / f}",
                    f"--out={tmp_path / f'{f}.json'}",
                    "--run_timeout=150",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONPATH=ROOT),
                start_new_session=True,
            )
    deadline = time.monotonic() + timeout
    try:
        for f, proc in procs.items():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, (tmp_path / f"{f}.log").read_text()[-6000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [
        r for f in frontends for r in json.loads((tmp_path / f"{f}.json").read_text())["results"]
    ]


@pytest.mark.timeout(760)
def test_a_killed_trainer_resumes_at_the_position_of_its_checkpoint(tmp_path):
    results = _campaigns(tmp_path, ("keras", "estimator"), timeout=740)
    assert {(r["frontend"], r["rows_per_message"]) for r in results} == {
        ("keras", 7),
        ("estimator", 7),
    }
    for r in results:
        # The kill hit a running trainer, before its last step.
        assert [run["end"] for run in r["runs"]] == ["killed", "done"], r
        resumed = r["runs"][0]["resumes_at_step"]
        assert 0 < resumed < STEPS, r
        assert r["final_step"] == STEPS and r["versions_checked"] >= 3, r
        # Read from the committed checkpoint's table: every produced row trained once.
        assert r["every_row_once"] and r["rows_trained_final"] == r["rows_produced"], r
        assert r["version_problems"] == {}, r
        assert not r["broker_ahead"], r
        # Whole 7-row messages (and the last, shorter one) make 0 rows modulo 7, or the
        # last one's: any other count of rows trained ends inside a message.
        assert r["versions_mid_message"] >= 1, r
        if BATCH * resumed % 7 not in (0, BATCH * STEPS % 7):
            assert r["restarts_mid_message"] == 1, r
