"""The short exactly-once campaign: a SIGKILL while each front end trains from a Kafka topic."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("confluent_kafka")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(460)
def test_a_killed_trainer_resumes_at_the_offsets_of_its_checkpoint(tmp_path):
    out = tmp_path / "kafka.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "kafka_exactly_once.py"),
            "--mode=short",
            f"--work_dir={tmp_path / 'work'}",
            f"--out={out}",
            "--run_timeout=150",
        ],
        check=True,
        timeout=440,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    results = json.loads(out.read_text())["results"]
    assert {r["frontend"] for r in results} == {"keras", "estimator"}
    for r in results:
        assert [run["end"] for run in r["runs"]] == ["killed", "done"], r
        assert r["final_step"] == 24 and r["versions_checked"] >= 3, r
        # Read from the committed checkpoint's table: every produced row trained once.
        assert r["every_row_once"] and r["rows_trained_final"] == r["rows_produced"], r
        assert r["version_problems"] == {}, r
        assert not r["broker_ahead"], r
