"""`TF_CONFIG` read as tf.estimator's `RunConfig` read it: the task and its cluster.

`TF_CONFIG` is JSON: `{"cluster": {"chief": [...], "worker": [...], "ps": [...]},
"task": {"type": "worker", "index": 1}}`. `ClusterInfo.from_environment()`
gives the properties `RunConfig` exposes (same names and values as
tf.estimator's):

| property | local (no `cluster`) | chief / worker / ps | evaluator |
|---|---|---|---|
| `cluster_spec` | empty | the cluster | empty (not part of training) |
| `task_type`, `task_id` | `worker`, 0 | from `task` | `evaluator`, index |
| `master` | `session_master` or "" | `grpc://<own address>` ("" when the cluster has one task) | "" |
| `evaluation_master` | `eval_session_master` or "" | "" | `eval_session_master` or "" |
| `num_ps_replicas` | 0 | number of `ps` tasks | 0 |
| `num_worker_replicas` | 1 | `worker` + `chief` tasks | 0 |
| `is_chief` | True | task type is `chief` | False |
| `global_id_in_cluster` | 0 | chief 0, then the other jobs by name and index, ps last | None |

Rules (errors name `TF_CONFIG` and the value): a cluster needs exactly one
`chief`; `task.type` and `task.index` are required with a cluster and must
name a task of it (except `evaluator`, which is outside the cluster); without
a cluster the task must be `worker` 0. The legacy `master` job is not supported.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf

CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"


def _error(rule: str, value) -> ValueError:
    return ValueError(f"TF_CONFIG: {rule}. Received: {value!r}")


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """The task this process runs and the training cluster (see the module docstring)."""

    cluster_spec: tf.train.ClusterSpec = dataclasses.field(
        default_factory=lambda: tf.train.ClusterSpec({})
    )
    task_type: str = WORKER
    task_id: int = 0
    master: str = ""
    evaluation_master: str = ""
    num_ps_replicas: int = 0
    num_worker_replicas: int = 1
    is_chief: bool = True
    global_id_in_cluster: int | None = 0

    @property
    def distributed(self) -> bool:
        """Whether this task trains with ps tasks (or is one): the parameter-server route."""
        return self.num_ps_replicas > 0 or self.task_type == PS

    @classmethod
    def from_environment(cls, environ=None) -> ClusterInfo:
        """Parses `TF_CONFIG` from `environ` (default `os.environ`).

        Raises:
          ValueError: `TF_CONFIG` is not JSON or breaks a rule of the module docstring.
        """
        text = (os.environ if environ is None else environ).get("TF_CONFIG") or "{}"
        try:
            tf_config = json.loads(text)
        except ValueError:
            raise _error("must be a JSON object", text) from None
        if not isinstance(tf_config, dict):
            raise _error("must be a JSON object", text)
        return cls.from_dict(tf_config)

    @classmethod
    def from_dict(cls, tf_config: dict) -> ClusterInfo:
        """Parses a `TF_CONFIG` dict (see `from_environment`)."""
        cluster = tf_config.get("cluster") or {}
        task = tf_config.get("task") or {}
        if not isinstance(cluster, dict) or not isinstance(task, dict):
            raise _error("`cluster` and `task` must be JSON objects", tf_config)
        if not cluster:
            return _local(tf_config, task)
        if "master" in cluster:
            raise _error(
                "npu_rec supports the `chief` job, not the legacy `master` job; rename it", cluster
            )
        return _distributed(tf_config, tf.train.ClusterSpec(cluster), task)


def _local(tf_config: dict, task: dict) -> ClusterInfo:
    task_type = task.get("type", WORKER)
    task_id = int(task.get("index", 0))
    if task_type != WORKER:
        raise _error('without "cluster", task type must be "worker"', task_type)
    if task_id != 0:
        raise _error('without "cluster", task index must be 0', task_id)
    return ClusterInfo(
        master=tf_config.get("session_master", ""),
        evaluation_master=tf_config.get("eval_session_master", ""),
    )


def _task_of(cluster_spec: tf.train.ClusterSpec, task: dict) -> tuple[str, int]:
    jobs = cluster_spec.jobs
    if CHIEF not in jobs or len(cluster_spec.job_tasks(CHIEF)) != 1:
        raise _error('a "cluster" must have exactly one "chief" task', cluster_spec.as_dict())
    task_type, task_id = task.get("type"), task.get("index")
    if not task_type:
        raise _error('with a "cluster", "task" must have a "type"', task)
    if task_id is None:
        raise _error('with a "cluster", "task" must have an "index"', task)
    if isinstance(task_id, bool) or int(task_id) < 0:
        raise _error("the task index must be an integer >= 0", task_id)
    task_id = int(task_id)
    if task_type == EVALUATOR:
        return task_type, task_id
    if task_type not in jobs:
        raise _error(f"task type {task_type!r} is not a job of the cluster {sorted(jobs)}", task)
    n = len(cluster_spec.job_tasks(task_type))
    if task_id >= n:
        raise _error(f"task index must be < {n}, the number of {task_type!r} tasks", task)
    return task_type, task_id


def _global_id(cluster_spec: tf.train.ClusterSpec, task_type: str, task_id: int) -> int:
    order = [CHIEF] + sorted(j for j in cluster_spec.jobs if j not in (CHIEF, PS))
    order += [PS] if PS in cluster_spec.jobs else []
    start = 0
    for job in order:
        if job == task_type:
            return start + task_id
        start += len(cluster_spec.job_tasks(job))
    raise AssertionError(f"{task_type} not in {order}")


def _distributed(tf_config: dict, cluster_spec: tf.train.ClusterSpec, task: dict) -> ClusterInfo:
    task_type, task_id = _task_of(cluster_spec, task)
    if task_type == EVALUATOR:
        return ClusterInfo(
            task_type=task_type,
            task_id=task_id,
            evaluation_master=tf_config.get("eval_session_master", ""),
            num_worker_replicas=0,
            is_chief=False,
            global_id_in_cluster=None,
        )
    jobs = cluster_spec.as_dict()
    if "session_master" in tf_config:
        master = tf_config["session_master"]
    elif len(jobs) == 1 and len(next(iter(jobs.values()))) == 1:
        master = ""
    else:
        master = "grpc://" + cluster_spec.task_address(task_type, task_id)
    return ClusterInfo(
        cluster_spec=cluster_spec,
        task_type=task_type,
        task_id=task_id,
        master=master,
        num_ps_replicas=len(jobs.get(PS, [])),
        num_worker_replicas=len(jobs.get(WORKER, [])) + len(jobs.get(CHIEF, [])),
        is_chief=task_type == CHIEF,
        global_id_in_cluster=_global_id(cluster_spec, task_type, task_id),
    )
