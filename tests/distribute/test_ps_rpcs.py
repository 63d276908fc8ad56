"""RPCs per training step between a trainer and each ps task on the parameter-server route.

A cluster of in-process servers (one worker, 2 ps tasks) runs a `tf.compat.v1`
training step of `T` tables placed as the Estimator's ps route places them
(`table_placement`: each table split into 2 shards, shard s on ps task s mod 2)
plus a dense variable on ps task 0. The step's partitioned graphs (run metadata)
show every tensor crossing between tasks as a `_Recv` in the receiving task's
partition; in the gRPC runtime each such `_Recv` is one `RecvTensor` RPC per run,
and each ps task also gets one `RunGraph` RPC per run. docs/distributed.md ("RPCs
per step on the ps route") records the counts.
"""

from __future__ import annotations

import re
import socket

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.distribute import _ps

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def _task(device: str) -> str:
    job, index = _TASK.search(device).groups()
    return f"{job}:{index}"


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _servers() -> dict:
    addresses = [f"127.0.0.1:{port}" for port in _free_ports(3)]
    cluster = tf.train.ClusterSpec({"worker": addresses[:1], "ps": addresses[1:]})
    return {
        (job, i): tf.distribute.Server(cluster, job_name=job, task_index=i, start=True)
        for job, n in (("ps", 2), ("worker", 1))
        for i in range(n)
    }


def _recvs_per_ps(servers: dict, num_tables: int) -> dict:
    """Per ps task: cross-task `_Recv`s of one training step, by direction."""
    from npu_rec.optimizers import Adagrad

    npu_rec.shutdown()
    try:
        with tf.Graph().as_default():
            with tf.compat.v1.device("/job:worker/task:0"):
                ids = tf.compat.v1.placeholder(tf.int64, [16, 4])
            feed = {ids: np.arange(64, dtype=np.int64).reshape(16, 4)}
            with _ps.table_placement(2):
                tables = [
                    npu_rec.create_table(f"t{num_tables}_{i}", 4, optimizer=Adagrad(0.1))
                    for i in range(num_tables)
                ]
            with tf.compat.v1.device(_ps.ps_device(0)):
                dense = tf.compat.v1.get_variable(f"dense{num_tables}", initializer=tf.ones([4]))
            with tf.compat.v1.device("/job:worker/task:0"):
                loss = tf.add_n(
                    [tf.reduce_sum(npu_rec.sparse_lookup(t, ids) * dense) for t in tables]
                )
                records = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
                grads = tf.gradients(loss, [dense] + [r.embeddings for r in records])
                train = tf.group(
                    npu_rec.apply_recorded_gradients(records, grads[1:]),
                    tf.compat.v1.assign_sub(dense, 0.1 * grads[0]),
                )
            init = tf.group(
                tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer(),
                tf.compat.v1.tables_initializer(),
            )
            with tf.compat.v1.Session(servers[("worker", 0)].target) as sess:
                sess.run(init)
                sess.run(train, feed)
                options = tf.compat.v1.RunOptions(output_partition_graphs=True)
                metadata = tf.compat.v1.RunMetadata()
                sess.run(train, feed, options=options, run_metadata=metadata)
    finally:
        npu_rec.shutdown()
    counts = {f"ps:{i}": {"to_ps": 0, "from_ps": 0} for i in range(2)}
    for graph in metadata.partition_graphs:
        for node in graph.node:
            if node.op not in ("_Recv", "_HostRecv"):
                continue
            send = _task(node.attr["send_device"].s.decode())
            recv = _task(node.attr["recv_device"].s.decode())
            if send == recv:
                continue
            if recv in counts:
                counts[recv]["to_ps"] += 1
            else:
                counts[send]["from_ps"] += 1
    return counts


def test_ps_route_step_rpcs_per_ps_task_grow_linearly_with_the_tables():
    servers = _servers()  # one cluster; each case's state has names of its own
    counts = {t: _recvs_per_ps(servers, t) for t in (1, 2, 4)}
    print("tensors crossing per step, per ps task:", counts)
    for ps in ("ps:0", "ps:1"):
        for way in ("to_ps", "from_ps"):
            one, two, four = (counts[t][ps][way] for t in (1, 2, 4))
            # Every table's lookup and update on a shard are ops of their own on the ps
            # task (under the shard's critical section): a fixed number of tensors
            # cross per table and ps task, each one RPC, so the RPCs grow with the tables.
            per_table = two - one
            assert per_table >= 5
            assert four == one + 3 * per_table
