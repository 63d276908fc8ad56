"""The short fault campaigns, both front ends: kills and a full disk, damaged checkpoints,
and kills aimed at a tiered table's promotion, demotion, compaction and save."""

import json
import os
import subprocess
import sys

import pytest

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
    # one front end trains compact tables (bfloat16 rows, RowWiseAdagrad), the other float32
    assert {r["tables"] for r in results} == {"bfloat16/rowwise_adagrad", "float32/adagrad"}
    for r in results:
        assert r["kills"] >= 1 and r["full_disk_runs"] == 1, r
        assert r["failed_restarts"] == [], r["failed_restarts"]
        assert r["restarts_checked"] >= 1, r
        assert r["resumed_from_newest"] == r["restarts_checked"], r
        assert r["versions_compared"] >= 5, r
        assert r["corrupt_or_inconsistent"] == 0 and r["positions_differing"] == 0, r
        assert r["leftovers"] == [], r["leftovers"]


@pytest.mark.timeout(560)
def test_damaged_checkpoints_are_described_truthfully_and_restarts_take_the_newest_intact(
    tmp_path,
):
    out = tmp_path / "corruption.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "fault_campaign.py"),
            "--campaign=corruption",
            "--mode=short",
            f"--work_dir={tmp_path / 'work'}",
            f"--out={out}",
            "--run_timeout=200",
        ],
        check=True,
        timeout=540,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    results = json.loads(out.read_text())["results"]
    assert {r["frontend"] for r in results} == {"keras", "estimator"}
    for r in results:
        assert r["failed_restarts"] == [] and r["leftovers"] == [], r
        assert r["damaged_dirs"] + len(r["not_applicable"]) == 8, r
        assert r["damaged_dirs"] >= 7 and r["inspect_crashes"] == 0, r
        assert r["damage_named"] == r["inspect_agrees_with_restore"] == r["damaged_dirs"], r
        assert r["restarts"] == 2, r
        assert r["resumed_from_newest_intact"] == r["intact_files_kept"] == 2, r
        assert r["versions_verified_after"] >= 2 and r["corrupt_after"] == 0, r


@pytest.mark.timeout(400)
def test_kills_aimed_at_the_tier_and_damaged_segments_resume_from_the_newest_version(tmp_path):
    out = tmp_path / "tier.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "fault_campaign.py"),
            "--campaign=tier",
            "--mode=short",
            f"--work_dir={tmp_path / 'work'}",
            f"--out={out}",
            "--run_timeout=150",
        ],
        check=True,
        timeout=380,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    results = json.loads(out.read_text())["results"]
    assert {r["frontend"] for r in results} == {"keras", "estimator"}
    # short mode shares the four points between the front ends
    killed = [p for r in results for p, n in r["kills"].items() if n >= 1]
    assert sorted(killed) == ["compaction", "demotion", "promotion", "save"], results
    for r in results:
        assert r["failed_restarts"] == [] and r["not_reached"] == [], r
        assert r["restarts_checked"] >= 2, r
        assert r["resumed_from_newest"] == r["restarts_checked"], r
        assert r["versions_compared"] >= 5, r
        assert r["corrupt_or_inconsistent"] == 0 and r["positions_differing"] == 0, r
        # the damaged segment is refused naming its file, and no version is made of it
        assert r["segments_damaged"] >= 1 and r["corruption_refused_by_name"] == 1, r
        assert r["versions_after_corruption"] <= 1, r
        assert r["leftovers"] == [] and r["segment_leftovers"] == [], r
