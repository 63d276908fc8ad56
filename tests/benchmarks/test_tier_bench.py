"""benchmarks/tier_bench.py in short mode, and the id law it draws from."""

import json
import os
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "tier_bench.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from _table_ids import bounded_zipf_ranks  # noqa: E402


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 40),
    a=st.sampled_from([0.5, 0.8, 1.05, 1.3, 2.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_bounded_zipf_draws_follow_zipfs_law_on_the_catalogue(n, a, seed):
    draws = 200_000
    ranks = bounded_zipf_ranks(np.random.default_rng(seed), a, n, draws)
    assert ranks.dtype == np.int64 and ranks.shape == (draws,)
    assert ranks.min() >= 0 and ranks.max() < n
    p = np.arange(1, n + 1, dtype=np.float64) ** -a
    p /= p.sum()
    freq = np.bincount(ranks, minlength=n) / draws
    # Five standard deviations of each rank's frequency.
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / draws) + 1e-12), (freq, p)


def test_a_large_catalogue_keeps_its_tail_mass():
    # At 1.05 and 5M keys, 6.8% of the mass lies past the hottest 20% (computed exactly);
    # folding the unbounded law into the keys would put about 36% there.
    n, a = 5_000_000, 1.05
    r = np.arange(1, n + 1, dtype=np.float64) ** -a
    tail = r[n // 5 :].sum() / r.sum()
    ranks = bounded_zipf_ranks(np.random.default_rng(0), a, n, 400_000)
    assert abs((ranks >= n // 5).mean() - tail) < 0.003, tail


def test_short_run_times_both_tables_saves_and_restores_in_a_new_process(tmp_path):
    out = tmp_path / "tier.json"
    subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--keys=5000",
            "--batch=64",
            "--fields=4",
            "--steps=3",
            "--warmup=2",
            f"--save_restore={tmp_path / 'ckpt'}",
            f"--ssd_path={tmp_path / 'ssd'}",
            f"--json={out}",
        ],
        check=True,
        timeout=240,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    report = json.loads(out.read_text())
    assert report["ids"] == "bounded" and report["distinct_batches"] == 5
    tier, memory = report["results"]
    assert (tier["table"], memory["table"]) == ("tiered", "memory")
    assert tier["memory_rows"] == 1000 and tier["size"] == memory["size"] == 5000
    assert tier["ratio_to_memory"] > 0 and 0 < tier["hit_rate"] <= 1
    # The CPU time of each table's timed steps, user and system.
    for r in (tier, memory):
        assert r["cpu_user_ms_per_step"] >= 0 and r["cpu_system_ms_per_step"] >= 0
        assert r["cpu_user_ms_per_step"] + r["cpu_system_ms_per_step"] > 0
    assert tier["restored_size"] == 5000 and tier["steps_per_s_after_restore"] > 0
    # Whether the machine's memory is handed back to a host (the appends' cost there).
    reporting = os.path.exists("/sys/module/page_reporting/parameters/page_reporting_order")
    assert (report["machine"]["free_page_reporting_order"] is not None) == reporting
    assert not (tmp_path / "ckpt").exists()  # the checkpoint is removed at the end
