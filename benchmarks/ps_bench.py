"""Steps/s of the Estimator's parameter-server route over loopback, per-table vs batched transfers.

One process starts a cluster of in-process servers (one worker and `--ps` ps
tasks, gRPC on 127.0.0.1) and trains the reference `model_fn` (`--model`,
default DLRM, a table per Criteo feature: 26 tables) on the worker as the
route's trainers build it: dense variables on the ps tasks round-robin, each
table's shards on the ps tasks by key hash. Two ways to send a step's tensors:

* `per_table`: each table's shards send and receive their own tensors (the
  plain `ShardedTable` on the ps devices, as the route did before it merged them);
* `batched`: the route's table (`PsShardedTable`) with the step's tensors
  merged over all tables (`batch_transfers`).

The modes alternate `--rounds` times in the same process (the ps state reset
between them); each round times `--steps` steps after `--warmup` untimed ones.
Also counted, from one step's partition graphs: the tensors crossing between
the worker and each ps task (each one `RecvTensor` RPC). Prints a table with
the load average and writes JSON.

    python benchmarks/ps_bench.py --batch_size=1024 --steps=30 --rounds=3
"""

import contextlib
import json
import os
import re
import socket
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_MODEL = flags.DEFINE_enum("model", "dlrm", ["dlrm", "deepfm", "wdl"], "Reference model.")
_BATCH = flags.DEFINE_integer("batch_size", 1024, "Batch size.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per round and mode.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 5, "Untimed steps before each round.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds (each mode once per round).", lower_bound=1)
_PS = flags.DEFINE_integer("ps", 2, "ps tasks.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab", 100_000, "Distinct ids per feature.", lower_bound=1)
_OUT = flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ps_bench.json"),
    "JSON output path.",
)
_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
MODES = ("per_table", "batched")


def _cluster(num_ps):
    import tensorflow as tf

    from npu_rec.estimator._ps import _servers

    sockets = [socket.socket() for _ in range(num_ps + 1)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    hosts = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    for sock in sockets:
        sock.close()
    cluster = tf.train.ClusterSpec({"worker": hosts[:1], "ps": hosts[1:]})
    for i in range(num_ps):
        _servers.start_server(cluster, "ps", i)
    return cluster, _servers.start_server(cluster, "worker", 0)


@contextlib.contextmanager
def _tables_as(mode):
    """Inside: the ps route creates `PsShardedTable`s (batched) or plain `ShardedTable`s."""
    from npu_rec.distribute import _ps_table
    from npu_rec.table._sharded import ShardedTable

    original = _ps_table.PsShardedTable
    if mode == "per_table":
        _ps_table.PsShardedTable = ShardedTable
    try:
        yield
    finally:
        _ps_table.PsShardedTable = original


def _data(batch):
    import numpy as np

    from npu_rec.data._synthetic import CATEGORICAL_NAMES, DENSE_NAMES, SyntheticCriteo

    rows = SyntheticCriteo(seed=3, vocab_sizes=(_VOCAB.value,) * 26).rows(0, 8 * batch)
    features = {n: rows[n].astype(np.int64) for n in CATEGORICAL_NAMES}
    features.update({n: rows[n].astype(np.float32) for n in DENSE_NAMES})
    return features, rows["label"].astype(np.float32)


def _crossings(metadata, num_ps):
    counts = {f"ps:{i}": [0, 0] for i in range(num_ps)}  # [to ps, from ps]
    for graph in metadata.partition_graphs:
        for node in graph.node:
            if node.op not in ("_Recv", "_HostRecv"):
                continue
            ends = [
                "{}:{}".format(*_TASK.search(node.attr[k].s.decode()).groups())
                for k in ("send_device", "recv_device")
            ]
            if ends[0] != ends[1]:
                if ends[1] in counts:
                    counts[ends[1]][0] += 1
                else:
                    counts[ends[0]][1] += 1
    return counts


def _round(mode, cluster, server, data, batch):
    import tensorflow as tf

    import npu_rec
    from npu_rec.data._synthetic import CATEGORICAL_NAMES, DENSE_NAMES
    from npu_rec.distribute import _ps
    from npu_rec.estimator import ModeKeys
    from npu_rec.estimator._ps import _servers
    from npu_rec.models import estimator_model_fn, specs_for

    num_ps = len(cluster.as_dict()["ps"])
    npu_rec.shutdown()
    tf.compat.v1.Session.reset(server.target)  # the previous round's state on the ps tasks
    model_fn = estimator_model_fn(_MODEL.value, specs_for(CATEGORICAL_NAMES), DENSE_NAMES, seed=1)
    graph = tf.Graph()
    with graph.as_default():
        setter = _servers.device_setter(cluster, "worker", 0)
        with graph.device(setter), _ps.table_placement(num_ps), _tables_as(mode):
            tf.compat.v1.train.get_or_create_global_step()
            features, labels = data
            dataset = tf.data.Dataset.from_tensor_slices((features, labels))
            dataset = dataset.batch(batch, drop_remainder=True).repeat().prefetch(2)
            feats, labs = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            spec = model_fn(feats, labs, ModeKeys.TRAIN, {}, None)
        merged = _ps.batch_transfers(graph) if mode == "batched" else 0
        init = tf.group(
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
            tf.compat.v1.tables_initializer(),
        )
        config = _servers.session_config("worker", 0)
        with tf.compat.v1.Session(server.target, config=config) as sess:
            sess.run(init)
            for _ in range(_WARMUP.value):
                sess.run(spec.train_op)
            options = tf.compat.v1.RunOptions(output_partition_graphs=True)
            metadata = tf.compat.v1.RunMetadata()
            sess.run(spec.train_op, options=options, run_metadata=metadata)
            start = time.perf_counter()
            for _ in range(_STEPS.value):
                sess.run(spec.train_op)
            elapsed = time.perf_counter() - start
    npu_rec.shutdown()
    return {
        "mode": mode,
        "steps_per_sec": _STEPS.value / elapsed,
        "merged": merged,
        "crossings": _crossings(metadata, num_ps),
    }


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cluster, server = _cluster(_PS.value)
    data = _data(_BATCH.value)
    load_before = os.getloadavg()
    runs = [
        _round(m, cluster, server, data, _BATCH.value) for _ in range(_ROUNDS.value) for m in MODES
    ]
    load_after = os.getloadavg()
    summary = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            "steps_per_sec_median": statistics.median(r["steps_per_sec"] for r in mine),
            "steps_per_sec_rounds": [round(r["steps_per_sec"], 3) for r in mine],
            "tensors_crossing_per_step": mine[0]["crossings"],
        }
    print(
        f"{_MODEL.value}, 26 tables, {_PS.value} ps tasks, batch {_BATCH.value}; "
        f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    print(f"{'mode':10} {'steps/s':>8}  rounds  crossings per ps task (to ps / from ps)")
    for mode, s in summary.items():
        cross = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in s["tensors_crossing_per_step"].items())
        print(f"{mode:10} {s['steps_per_sec_median']:8.2f}  {s['steps_per_sec_rounds']}  {cross}")
    result = {
        "command": "python benchmarks/ps_bench.py " + " ".join(sys.argv[1:]),
        "model": _MODEL.value,
        "batch_size": _BATCH.value,
        "steps": _STEPS.value,
        "rounds": _ROUNDS.value,
        "ps": _PS.value,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "modes": summary,
    }
    os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
    with open(_OUT.value, "w") as f:
        json.dump(result, f, indent=2)
    os._exit(0)  # the in-process servers never stop on their own


if __name__ == "__main__":
    app.run(main)
