"""Tests of bind_cpu: process affinity, TensorFlow thread pools, reporting."""

import json
import logging as pylog
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import npu_rec
from npu_rec import _cpu

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="no os.sched_setaffinity on this platform"
)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    npu_rec.shutdown()
    yield
    npu_rec.shutdown()


@pytest.mark.parametrize(
    "available, rank, size, expected",
    [
        ({0, 1, 2, 3}, None, None, (0, 1, 2, 3)),
        ({3, 1, 2}, None, None, (1, 2, 3)),
        ({0, 1, 2, 3}, 0, 1, (0, 1, 2, 3)),
        ({0, 1, 2, 3}, 0, 2, (0, 1)),
        ({0, 1, 2, 3}, 1, 2, (2, 3)),
        ({0, 1, 2, 3, 4}, 0, 2, (0, 1, 2)),
        ({0, 1, 2, 3, 4}, 1, 2, (3, 4)),
        ({0, 1}, 2, 3, (0,)),  # more processes than cores: round-robin, never empty
        (set(), None, None, ()),
    ],
)
def test_plan_cores(available, rank, size, expected):
    assert _cpu.plan_cores(available, rank, size) == expected


def test_plan_cores_shares_are_disjoint_and_cover_everything():
    cores = set(range(7))
    shares = [_cpu.plan_cores(cores, rank, 3) for rank in range(3)]
    assert sorted(c for share in shares for c in share) == sorted(cores)


def test_plan_cores_rejects_bad_rank():
    with pytest.raises(ValueError, match="local_rank=2, local_size=2"):
        _cpu.plan_cores({0, 1}, 2, 2)


@needs_affinity
def test_bind_cpu_pins_to_available_cores_and_reports_them():
    available = tuple(sorted(os.sched_getaffinity(0)))
    npu_rec.init(bind_cpu=True)
    binding = npu_rec.get_cpu_binding()
    assert binding.cores == available and binding.pinned
    assert tuple(sorted(os.sched_getaffinity(0))) == available
    assert str(list(available)) in binding.message
    if binding.tf_threads:
        assert tf.config.threading.get_intra_op_parallelism_threads() == len(available)
        assert tf.config.threading.get_inter_op_parallelism_threads() == len(available)
    else:
        assert "already initialised" in binding.message


def test_bind_cpu_false_binds_nothing():
    npu_rec.init(bind_cpu=False)
    assert npu_rec.get_cpu_binding() is None


@needs_affinity
def test_local_rank_share_is_pinned_and_shutdown_restores_affinity(monkeypatch):
    before = set(os.sched_getaffinity(0))
    if len(before) < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    npu_rec.init()
    expected = _cpu.plan_cores(before, 1, 2)
    assert npu_rec.get_cpu_binding().cores == expected
    assert os.sched_getaffinity(0) == set(expected)
    npu_rec.shutdown()
    assert os.sched_getaffinity(0) == before
    assert npu_rec.get_cpu_binding() is None


def test_refused_thread_pools_are_logged_not_raised(monkeypatch, caplog):
    def refuse(n):
        raise RuntimeError("Intra op parallelism cannot be modified after initialization.")

    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", refuse)
    with caplog.at_level(pylog.WARNING):
        npu_rec.init(bind_cpu=True)
    binding = npu_rec.get_cpu_binding()
    assert not binding.tf_threads
    assert "already initialised" in binding.message
    assert any("already initialised" in r.getMessage() for r in caplog.records)


@needs_affinity
def test_fresh_process_gets_its_share_and_thread_pools():
    """In a new process (TF runtime not started yet) both effects apply."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    script = textwrap.dedent("""
        import json, os
        import npu_rec, tensorflow as tf
        npu_rec.init(bind_cpu=True)
        tf.constant(1) + 1  # start the runtime with the configured pools
        b = npu_rec.get_cpu_binding()
        print(json.dumps({"cores": list(b.cores), "tf_threads": b.tf_threads,
                          "affinity": sorted(os.sched_getaffinity(0)),
                          "intra": tf.config.threading.get_intra_op_parallelism_threads(),
                          "inter": tf.config.threading.get_inter_op_parallelism_threads()}))
    """)
    env = dict(os.environ, LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = list(_cpu.plan_cores(os.sched_getaffinity(0), 0, 2))
    assert result["cores"] == expected == result["affinity"]
    assert result["tf_threads"] is True
    assert result["intra"] == result["inter"] == len(expected)
