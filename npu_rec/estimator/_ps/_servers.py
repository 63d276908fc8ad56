"""The servers of the parameter-server route: one per task, dense placement, the end of the job.

This is the `tf.compat.v1` between-graph replication that `tf.estimator` ran
from `TF_CONFIG` (docs/distributed.md, "The Estimator route"):

* every task (`chief`, `worker`, `ps`) runs one `tf.distribute.Server`
  (`start_server`, once per process); the chief and the workers build the same
  graph and run it in a session on their own server (`master = server.target`);
* dense variables go to the ps tasks round-robin (`device_setter`, TensorFlow's
  `replica_device_setter`); the other ops stay on the task's own device; the
  sparse tables' shards are placed by `npu_rec.distribute._ps.table_placement`;
* a task's sessions see only the ps tasks and itself (`session_config`);
* a ps task serves until every trainer (the chief and each worker) has put one
  "done" token on each ps task's queue (`signal_done` / `serve`), then returns,
  so a ps task exits on its own when training ends.
"""

from __future__ import annotations

import time

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.distribute._ps import PS, ps_device

#: Ops placed on the ps tasks by `device_setter` (tf.estimator's list).
PS_OPS = (
    "Variable",
    "VariableV2",
    "AutoReloadVariable",
    "MutableHashTable",
    "MutableHashTableV2",
    "MutableHashTableOfTensors",
    "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable",
    "MutableDenseHashTableV2",
    "NpuRecKeyMap",
    "VarHandleOp",
)
_DONE_QUEUE = "npu_rec_training_done"
_POLL_MS = 1000
_servers: dict[tuple, tf.distribute.Server] = {}


def device_setter(cluster_spec: tf.train.ClusterSpec, task_type: str, task_id: int):
    """The device function of a trainer's graph: dense variables round-robin on the ps tasks."""
    return tf.compat.v1.train.replica_device_setter(
        ps_tasks=len(cluster_spec.as_dict().get(PS, [])),
        worker_device=f"/job:{task_type}/task:{task_id}",
        merge_devices=True,
        ps_ops=list(PS_OPS),
        cluster=cluster_spec,
    )


def device_filters(task_type: str, task_id: int) -> list[str] | None:
    """The devices a task's sessions see (tf.estimator's rule): the ps tasks and itself."""
    if task_type == "chief":
        return ["/job:ps", "/job:chief"]
    if task_type == "worker":
        return ["/job:ps", f"/job:worker/task:{task_id}"]
    if task_type == PS:
        return ["/job:ps", "/job:worker", "/job:chief"]
    return None


def session_config(task_type: str, task_id: int, base=None) -> tf.compat.v1.ConfigProto:
    """A copy of `base` with the task's device filters (when it has none).

    Without `base`: a new ConfigProto with soft placement, as tf.estimator's default.
    """
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if base is not None:
        config.CopyFrom(base)
    filters = device_filters(task_type, task_id)
    if filters and not config.device_filters:
        config.device_filters.extend(filters)
    return config


def start_server(cluster_spec: tf.train.ClusterSpec, task_type: str, task_id: int):
    """This task's `tf.distribute.Server` (started once per process, then reused).

    npu_rec's table kernels are loaded first: ops of the tables run on the ps tasks.
    """
    key = (repr(sorted(cluster_spec.as_dict().items())), task_type, task_id)
    server = _servers.get(key)
    if server is None:
        from npu_rec.table import _fused  # noqa: PLC0415

        _fused.load_kernels()
        server = tf.distribute.Server(
            cluster_spec,
            job_name=task_type,
            task_index=task_id,
            config=session_config(task_type, task_id),
            start=True,
        )
        _servers[key] = server
        logging.info("npu_rec: task %s:%d serves at %s.", task_type, task_id, server.target)
    return server


def _done_queue(index: int):
    with tf.compat.v1.device(ps_device(index)):
        return tf.queue.FIFOQueue(
            1 << 20, [tf.int32], shapes=[[]], shared_name=f"{_DONE_QUEUE}_{index}", name="done"
        )


def signal_done(target: str, num_ps: int, task_type: str, task_id: int) -> None:
    """Puts this trainer's "done" token on every ps task's queue (through `target`)."""
    with tf.Graph().as_default():
        ops = [_done_queue(i).enqueue(tf.constant(1)) for i in range(num_ps)]
        with tf.compat.v1.Session(target, config=session_config(task_type, task_id)) as sess:
            sess.run(ops)
    logging.info("npu_rec: %s:%d told the ps tasks that it finished training.", task_type, task_id)


def serve(
    cluster_spec: tf.train.ClusterSpec, task_id: int, trainers: int, timeout_secs=None
) -> None:
    """Runs ps task `task_id` until `trainers` "done" tokens have arrived, then returns.

    Args:
      cluster_spec: The cluster.
      task_id: This ps task's index.
      trainers: How many tokens end the job (the chief and every worker).
      timeout_secs: Give up after this many seconds (None: wait for ever).

    Raises:
      TimeoutError: `timeout_secs` passed first.
    """
    server = start_server(cluster_spec, PS, task_id)
    start = time.monotonic()
    received = 0
    with tf.Graph().as_default():
        dequeue = _done_queue(task_id).dequeue()
        options = tf.compat.v1.RunOptions(timeout_in_ms=_POLL_MS)
        config = tf.compat.v1.ConfigProto(device_filters=[ps_device(task_id)])
        with tf.compat.v1.Session(server.target, config=config) as sess:
            while received < trainers:
                try:
                    sess.run(dequeue, options=options)
                    received += 1
                except tf.errors.DeadlineExceededError:
                    pass
                if timeout_secs is not None and time.monotonic() - start > timeout_secs:
                    raise TimeoutError(
                        f"ps task {task_id} waited {timeout_secs:g} s for the end of "
                        f"training; {received} of {trainers} trainers finished."
                    )
    logging.info("npu_rec: ps:%d: all %d trainers finished; it stops serving.", task_id, trainers)
