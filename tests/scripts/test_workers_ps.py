"""`scripts/_workers.py` on the Estimator's ps route: roles, data shares, one model_dir."""

import json

import pytest

from npu_rec.scripts import _workers

CLUSTER = {"chief": ["a:1"], "worker": ["a:2", "a:3"], "ps": ["a:4"]}


@pytest.fixture
def task(monkeypatch):
    def set_task(job, index, cluster=CLUSTER):
        monkeypatch.setattr(_workers, "_STRATEGY", None)
        monkeypatch.setattr(_workers, "_PS_TASK", None)
        tf_config = {"cluster": cluster, "task": {"type": job, "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        return _workers.setup()

    return set_task


@pytest.mark.parametrize(
    "job, index, share, writes",
    [
        ("chief", 0, (3, 0), True),
        ("worker", 0, (3, 1), False),
        ("worker", 1, (3, 2), False),
        ("ps", 0, (1, 0), False),
        ("evaluator", 0, (1, 0), False),
    ],
)
def test_each_trainer_reads_its_share_and_only_the_chief_writes(task, job, index, share, writes):
    assert task(job, index) is None  # no MultiWorkerMirroredStrategy on the ps route
    assert _workers.role() == job
    assert _workers.shard() == share
    assert _workers.writes_files() is writes
    assert _workers.model_dir("/tmp/run") == "/tmp/run"  # every task shares it
    _workers.check_frontend("estimator")
    with pytest.raises(SystemExit, match="--frontend=keras cannot run with ps tasks"):
        _workers.check_frontend("keras")


def test_ps_tasks_without_a_chief_are_refused(task):
    with pytest.raises(SystemExit, match="needs one chief task: launch with --chief"):
        task("worker", 0, {"worker": ["a:2"], "ps": ["a:4"]})
