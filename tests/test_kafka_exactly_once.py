"""The short exactly-once campaign: a SIGKILL while each front end trains from a Kafka topic
of seven rows per message (a batch of 32 rows ends inside a message, so saves and restarts
land there). Every check made with one row per message (each row trained once, the restart
at its checkpoint's position, the broker's offsets not ahead) is made here too; the one-row
topic itself, where no save can fall inside a message, is left to the long campaign."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("confluent_kafka")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 32


@pytest.mark.timeout(760)
def test_a_killed_trainer_resumes_at_the_position_of_its_checkpoint(tmp_path):
    out = tmp_path / "kafka.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "kafka_exactly_once.py"),
            "--mode=short",
            "--rows_per_message=7",
            f"--work_dir={tmp_path / 'work'}",
            f"--out={out}",
            "--run_timeout=150",
        ],
        check=True,
        timeout=740,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    results = json.loads(out.read_text())["results"]
    assert {(r["frontend"], r["rows_per_message"]) for r in results} == {
        ("keras", 7),
        ("estimator", 7),
    }
    for r in results:
        # The kill hit a running trainer, before its last step.
        assert [run["end"] for run in r["runs"]] == ["killed", "done"], r
        resumed = r["runs"][0]["resumes_at_step"]
        assert 0 < resumed < 24, r
        assert r["final_step"] == 24 and r["versions_checked"] >= 3, r
        # Read from the committed checkpoint's table: every produced row trained once.
        assert r["every_row_once"] and r["rows_trained_final"] == r["rows_produced"], r
        assert r["version_problems"] == {}, r
        assert not r["broker_ahead"], r
        # Whole 7-row messages (and the last, of 5 rows) make 0 or 5 rows modulo 7:
        # any other count of rows trained ends inside a message.
        assert r["versions_mid_message"] >= 1, r
        if BATCH * resumed % 7 not in (0, 5):
            assert r["restarts_mid_message"] == 1, r
