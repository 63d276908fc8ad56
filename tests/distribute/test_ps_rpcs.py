"""RPCs per training step between a trainer and each ps task on the parameter-server route.

A cluster of in-process servers (one worker, 2 ps tasks) runs `tf.compat.v1`
training steps of tables placed as the Estimator's ps route places them
(`table_placement`: each table split into 2 shards, shard s on ps task s mod 2)
plus a dense variable on ps task 0, with the step's trainer <-> ps tensors
merged over all tables as the route's trainers merge them (`batch_transfers`).
The step's partitioned graphs (run metadata) show every tensor crossing between
tasks as a `_Recv` in the receiving task's partition; in the gRPC runtime each
such `_Recv` is one `RecvTensor` RPC per run, and each ps task also gets one
`RunGraph` RPC per run. docs/distributed.md ("RPCs per step on the ps route")
records the counts.
"""

from __future__ import annotations

import contextlib
import re
import socket

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.distribute import _ps
from npu_rec.optimizers import SGD, Adagrad, Adam, Ftrl

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_TRAINER = "/job:worker/task:0"


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


@pytest.fixture(scope="module")
def servers() -> dict:
    """One cluster for the module; each graph's state has names of its own."""
    addresses = [f"127.0.0.1:{port}" for port in _free_ports(3)]
    cluster = tf.train.ClusterSpec({"worker": addresses[:1], "ps": addresses[1:]})
    return {
        (job, i): tf.distribute.Server(cluster, job_name=job, task_index=i, start=True)
        for job, n in (("ps", 2), ("worker", 1))
        for i in range(n)
    }


def _crossings(metadata) -> dict:
    """Per ps task: cross-task `_Recv`s of one run, by direction."""
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


def _recvs_per_ps(servers: dict, num_tables: int) -> dict:
    """Per ps task: cross-task `_Recv`s of one training step of `num_tables` tables."""
    npu_rec.shutdown()
    try:
        with tf.Graph().as_default():
            with tf.compat.v1.device(_TRAINER):
                ids = tf.compat.v1.placeholder(tf.int64, [16, 4])
            feed = {ids: np.arange(64, dtype=np.int64).reshape(16, 4)}
            with _ps.table_placement(2):
                tables = [
                    npu_rec.create_table(f"t{num_tables}_{i}", 4, optimizer=Adagrad(0.1))
                    for i in range(num_tables)
                ]
            with tf.compat.v1.device(_ps.ps_device(0)):
                dense = tf.compat.v1.get_variable(f"dense{num_tables}", initializer=tf.ones([4]))
            with tf.compat.v1.device(_TRAINER):
                weight = tf.identity(dense)  # read once, as a layer reads its kernel
                loss = tf.add_n(
                    [tf.reduce_sum(npu_rec.sparse_lookup(t, ids) * weight) for t in tables]
                )
                records = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
                grads = tf.gradients(loss, [dense] + [r.embeddings for r in records])
                train = tf.group(
                    npu_rec.apply_recorded_gradients(records, grads[1:]),
                    tf.compat.v1.assign_sub(dense, 0.1 * grads[0]),
                )
            _ps.batch_transfers()  # as the route's trainers do when their session opens
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
    return _crossings(metadata)


def test_ps_route_step_rpcs_per_ps_task_do_not_grow_with_the_tables(servers):
    counts = {t: _recvs_per_ps(servers, t) for t in (1, 2, 4)}
    print("tensors crossing per step, per ps task:", counts)
    # Every table's shards on a ps task get their keys in one tensor and their gradients
    # in another, and send back their rows in one and their updates' completion in
    # another; ps:0 also holds the dense variable (its read and its update cross).
    expected = {"ps:0": {"to_ps": 3, "from_ps": 3}, "ps:1": {"to_ps": 2, "from_ps": 2}}
    assert counts == {1: expected, 2: expected, 4: expected}


# ------------------------------------------------------------ the same training as one process
_STEPS = [
    (np.array([[1, 2, 3], [3, 4, 5], [6, 1, 9], [2, 2, 7]]), [100, 101, 102, 103]),
    (np.array([[2, 8, 4], [9, 4, 11], [12, 10, 9], [5, 10, 7]]), [110, 111, 112, 113]),
    (np.array([[13, 2, 3], [3, 14, 5], [6, 1, 15], [4, 2, 8]]), [120, 121, 122, 123]),
]


def _program(on_ps: bool):
    """Tables of every kind of update, and a training step over them.

    `on_ps`: tables on the 2 ps tasks and the step on the trainer (else one process).
    Returns (tables, ids and times placeholders, the train op, an update of ids' rows).
    """
    place = _ps.table_placement if on_ps else lambda n: contextlib.nullcontext()
    with place(2):
        a = npu_rec.create_table("a", 4, optimizer=Adagrad(0.1))
        # Admission after two sightings (keys without a row read zeros), eviction on.
        b = npu_rec.create_table(
            "b", 3, optimizer=Adam(0.05), access_threshold=2, eviction_threshold=15
        )
        e = npu_rec.create_table("e", 2, optimizer=SGD(0.3))
    with place(1):  # one shard on ps:0
        c = npu_rec.create_table("c", 5, optimizer=Ftrl(0.2))

    def trainer():
        return tf.compat.v1.device(_TRAINER) if on_ps else contextlib.nullcontext()

    with trainer():
        ids = tf.compat.v1.placeholder(tf.int64, [4, 3])
        times = tf.compat.v1.placeholder(tf.int64, [4])
        emb_a = npu_rec.sparse_lookup(a, ids, timestamps=times)  # per-id times
        emb_b = npu_rec.sparse_lookup(b, ids, combiner="mean", timestamps=times[0])  # one time
        twice = [npu_rec.sparse_lookup(c, ids[:, :2]), npu_rec.sparse_lookup(c, ids[:, 1:])]
        # Ids computed from another table's rows: their lookup waits for those rows.
        derived = ids + tf.cast(tf.abs(emb_a[..., 0]) * 100.0, tf.int64) % 3
        emb_e = npu_rec.sparse_lookup(e, derived, combiner="sum", timestamps=times[0])
        read = npu_rec.sparse_lookup(a, ids + 1, is_training=False)  # no admission, no update
        loss = (
            tf.reduce_sum(tf.square(emb_a - 0.5))
            + tf.reduce_sum(emb_b * [1.0, -2.0, 3.0])
            + sum(tf.reduce_sum(tf.sin(t)) for t in twice)
            + tf.reduce_sum(tf.square(emb_e))
            + tf.reduce_sum(read)
        )
        records = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        grads = tf.gradients(loss, [r.embeddings for r in records])
        train = npu_rec.apply_recorded_gradients(records, grads)
    if on_ps:
        _ps.batch_transfers()
    with trainer():  # run apart from the step (its tensors are not merged with the step's)
        extra = b.apply_gradients(ids, tf.fill([4, 3, 3], 0.25))  # rows found by key
    return [a, b, c, e], (ids, times), train, extra


def _train(on_ps: bool, servers) -> dict:
    npu_rec.shutdown()
    try:
        with tf.Graph().as_default():
            tables, (ids, times), train, extra = _program(on_ps)
            target = servers[("worker", 0)].target if on_ps else ""
            with tf.compat.v1.Session(target) as sess:
                sess.run(
                    [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
                )
                for step, (batch, stamps) in enumerate(_STEPS):
                    sess.run(train, {ids: batch, times: stamps})
                    if step == 1:  # b's keys 1 and 3, last seen at 100, are idle longer than 15 s
                        assert tables[1].evict(now=120, session=sess) == 2
                sess.run(extra, {ids: _STEPS[0][0]})
                return {t.name: t.read_state(session=sess) for t in tables}
    finally:
        npu_rec.shutdown()


def test_ps_route_trains_every_table_as_one_process_does(servers):
    """Batched over the tables, the cluster's step updates each table as one process does."""
    local, cluster = _train(False, servers), _train(True, servers)
    for name, state in local.items():
        assert state["keys"].size > 0
        for field, value in state.items():
            np.testing.assert_allclose(
                cluster[name][field], value, rtol=1e-6, err_msg=f"{name}: {field}"
            )
