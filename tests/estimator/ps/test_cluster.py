"""`TF_CONFIG` read by `NPURunConfig` as tf.estimator's RunConfig read it, and the ps route's tasks."""

import json

import pytest
import tensorflow as tf

from npu_rec import estimator as E
from npu_rec.distribute import _ps
from npu_rec.estimator import _ps as ps_route
from npu_rec.estimator._ps import _servers, _tasks

CLUSTER = {
    "chief": ["host0:2222"],
    "ps": ["host1:2222", "host2:2222"],
    "worker": ["host3:2222", "host4:2222", "host5:2222"],
}
PROPERTIES = (
    "task_type",
    "task_id",
    "master",
    "evaluation_master",
    "num_ps_replicas",
    "num_worker_replicas",
    "is_chief",
    "global_id_in_cluster",
)


def _config(monkeypatch, tf_config):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    return E.NPURunConfig()


@pytest.mark.parametrize(
    "tf_config, expected, cluster",
    [
        (None, ("worker", 0, "", "", 0, 1, True, 0), {}),
        (
            {"session_master": "grpc://x:1", "eval_session_master": "grpc://y:1"},
            ("worker", 0, "grpc://x:1", "grpc://y:1", 0, 1, True, 0),
            {},
        ),
        (
            {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}},
            ("worker", 1, "grpc://host4:2222", "", 2, 4, False, 2),
            CLUSTER,
        ),
        (
            {"cluster": CLUSTER, "task": {"type": "chief", "index": 0}},
            ("chief", 0, "grpc://host0:2222", "", 2, 4, True, 0),
            CLUSTER,
        ),
        (
            {"cluster": CLUSTER, "task": {"type": "ps", "index": 1}},
            ("ps", 1, "grpc://host2:2222", "", 2, 4, False, 5),
            CLUSTER,
        ),
        (
            {"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}},
            ("evaluator", 0, "", "", 0, 0, False, None),
            {},
        ),
        (
            {"cluster": {"chief": ["host0:2222"]}, "task": {"type": "chief", "index": 0}},
            ("chief", 0, "", "", 0, 1, True, 0),
            {"chief": ["host0:2222"]},
        ),
    ],
)
def test_properties_follow_tf_estimator(monkeypatch, tf_config, expected, cluster):
    config = _config(monkeypatch, tf_config)
    assert tuple(getattr(config, p) for p in PROPERTIES) == expected
    assert config.cluster_spec.as_dict() == cluster
    assert config.replace(save_checkpoints_steps=5).master == config.master


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ({"task": {"type": "ps"}}, 'without "cluster", task type must be "worker"'),
        ({"task": {"index": 2}}, 'without "cluster", task index must be 0'),
        ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}, 'one "chief"'),
        ({"cluster": CLUSTER, "task": {"index": 0}}, '"task" must have a "type"'),
        ({"cluster": CLUSTER, "task": {"type": "worker"}}, '"task" must have an "index"'),
        ({"cluster": CLUSTER, "task": {"type": "master", "index": 0}}, "not a job of the cluster"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": 3}}, "task index must be < 3"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": -1}}, "integer >= 0"),
        ({"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}}, "legacy"),
    ],
)
def test_malformed_tf_config_is_refused_naming_it(monkeypatch, tf_config, message):
    with pytest.raises(ValueError, match="TF_CONFIG") as err:
        _config(monkeypatch, tf_config)
    assert message in str(err.value)


def test_tf_config_that_is_not_json_is_refused(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{cluster")
    with pytest.raises(
        ValueError, match=r"TF_CONFIG: must be a JSON object. Received: '\{cluster'"
    ):
        E.NPURunConfig()


@pytest.mark.parametrize(
    "task_type, task_id, filters",
    [
        ("chief", 0, ["/job:ps", "/job:chief"]),
        ("worker", 2, ["/job:ps", "/job:worker/task:2"]),
        ("ps", 0, ["/job:ps", "/job:worker", "/job:chief"]),
    ],
)
def test_sessions_see_only_the_ps_tasks_and_themselves(task_type, task_id, filters):
    config = _servers.session_config(task_type, task_id)
    assert list(config.device_filters) == filters and config.allow_soft_placement
    user = tf.compat.v1.ConfigProto(device_filters=["/job:ps"], inter_op_parallelism_threads=2)
    merged = _servers.session_config(task_type, task_id, user)
    assert list(merged.device_filters) == ["/job:ps"] and merged.inter_op_parallelism_threads == 2


def test_tables_are_sharded_over_the_ps_tasks_by_key_hash():
    import npu_rec

    npu_rec.shutdown()
    try:
        with tf.Graph().as_default(), _ps.table_placement(2):
            three = npu_rec.create_table("three", 4, num_shards=3)
            two = npu_rec.create_table("two", 4)
            with _ps.table_placement(1):
                one = npu_rec.create_table("one", 4)
        assert [s.variables()[0].device for s in three.shards] == [
            "/job:ps/task:0",
            "/job:ps/task:1",
            "/job:ps/task:0",
        ]
        assert [s.variables()[0].device for s in two.shards] == ["/job:ps/task:0", "/job:ps/task:1"]
        assert one.num_shards == 1 and {v.device for v in one.variables()} == {"/job:ps/task:0"}
    finally:
        npu_rec.shutdown()


@pytest.mark.parametrize(
    "tf_config, kwargs, message",
    [
        (
            {"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}},
            {},
            "The evaluator task does not train: call npu_rec.estimator.train_and_evaluate",
        ),
        (
            {"cluster": CLUSTER, "task": {"type": "worker", "index": 0}},
            {"experimental_config": E.ExperimentalConfig(accelerate_train_mode="fast1|step|0.5")},
            "accelerate_train_mode is not supported with ps tasks",
        ),
    ],
)
def test_what_the_ps_route_cannot_train_is_refused(monkeypatch, tf_config, kwargs, message):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(ValueError, match=message):
        ps_route.check_trainable(E.NPURunConfig(**kwargs))


class _FakeEstimator:
    """Checkpoints appear one per `latest_checkpoint()` call; `evaluate` records each."""

    model_dir = "/m"

    def __init__(self, steps):
        self.steps, self.evaluated = list(steps), []

    def latest_checkpoint(self):
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        return None if step is None else f"/m/model.ckpt-{step}"

    def evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
        self.evaluated.append(checkpoint_path)
        return {"global_step": int(checkpoint_path.rsplit("-", 1)[1]), "loss": 0.5}


def test_evaluator_evaluates_each_new_checkpoint_until_max_steps(monkeypatch):
    monkeypatch.setattr(_tasks, "EVAL_POLL_SECS", 0.0)
    est = _FakeEstimator([None, 10, 10, 20, 30, 40])
    spec = E.EvalSpec(lambda: None, steps=2)
    result, exports = ps_route.evaluate_checkpoints(est, spec, max_steps=30)
    assert est.evaluated == ["/m/model.ckpt-10", "/m/model.ckpt-20", "/m/model.ckpt-30"]
    assert result["global_step"] == 30 and exports == []
    with pytest.raises(TimeoutError, match="no checkpoint at step 50 in '/m' within"):
        ps_route.evaluate_checkpoints(_FakeEstimator([10]), spec, 50, timeout_secs=0.01)
