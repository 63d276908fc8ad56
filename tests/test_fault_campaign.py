"""The short fault campaign: SIGKILLs and a full disk during both front ends' training and saves."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_restart_resumes_from_the_newest_committed_version_intact(tmp_path):
    out = tmp_path / "faults.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "fault_campaign.py"),
            "--mode=short",
            f"--work_dir={tmp_path / 'work'}",
            f"--out={out}",
            "--run_timeout=120",
        ],
        check=True,
        timeout=280,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    results = json.loads(out.read_text())["results"]
    assert {r["frontend"] for r in results} == {"keras", "estimator"}
    for r in results:
        assert r["kills"] >= 1 and r["full_disk_runs"] == 1, r
        assert r["failed_restarts"] == [], r["failed_restarts"]
        assert r["restarts_checked"] >= 1, r
        assert r["resumed_from_newest"] == r["restarts_checked"], r
        assert r["versions_compared"] >= 5, r
        assert r["corrupt_or_inconsistent"] == 0 and r["positions_differing"] == 0, r
        assert r["leftovers"] == [], r["leftovers"]
