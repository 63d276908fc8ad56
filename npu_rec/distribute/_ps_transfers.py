"""The tensors a trainer and a ps task exchange in a step, sent as few tensors as possible.

On the parameter-server route every tensor that crosses between a trainer and a
ps task in a step is one `RecvTensor` RPC (TensorFlow's gRPC runtime), and every
control edge that crosses is one more. Table code never lets a tensor cross
directly: it packs what one shard needs into one flat tensor (int64 or
float32) and passes it through `send`, which builds the receiving op on the
destination device and registers the pair in the graph. Once the graph holds
the whole step (every table's lookup and update), `batch(graph)` merges the
registered transfers that go the same way between the same two tasks at the
same stage of the step: on the sending device their tensors and their sizes
are concatenated into one tensor, on the receiving device that tensor is split
again, and each receiving op is re-pointed at its piece. So a step makes one
crossing per ps task and way per stage (the lookups' keys, their rows, the
gradients, the updates' completion), whatever the number of tables.

Stages: a transfer's stage is one more than the largest stage among the
transfers it depends on (through data or control edges), so transfers of one
stage never depend on each other and merging them cannot make a cycle (the
rows of a lookup whose ids come from another lookup's rows go in a later
batch). `batch` must run before a session first runs the graph: the route's
trainers call it when they open their session (`npu_rec.estimator._ps`).

A merged tensor couples the ops that read it: a run that needs one piece
computes every piece's sending side (e.g. an update's gradients need all the
tables' lookups). The route merges the graph of one training step, whose train
op needs every piece anyway; a graph with several train ops run apart should
not be merged.

Only plain v1 graph code is registered (not a `tf.function`, not inside a v1
`tf.cond` / `tf.while_loop`); `send` there is a plain identity on the receiving
device.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._compat import in_control_flow, keep_out_of_meta_graphs, rewire_input

#: Graph collection of the receiving ops of registered transfers.
COLLECTION = "npu_rec_ps_transfers"
keep_out_of_meta_graphs(COLLECTION)
_DTYPES = (tf.int64, tf.float32)


def batchable() -> bool:
    """Whether ops built now can be registered (a plain v1 graph, outside control flow)."""
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return not graph.building_function and not in_control_flow(graph)


def send(tensor: tf.Tensor, name: str = "transfer") -> tf.Tensor:
    """`tensor` (1-D, int64 or float32) as received on the current device scope.

    Call it in the receiving device's scope (`tf.compat.v1.device`). The
    receiving op takes no control inputs of the surrounding context (those stay
    on the sending side, where `tensor` was built), so only the data crosses.
    """
    if not batchable():
        return tf.identity(tensor, name=name)
    if tensor.dtype not in _DTYPES or tensor.shape.rank != 1:
        raise TypeError(
            f"A ps transfer sends a 1-D int64 or float32 tensor. Received: dtype="
            f"{tensor.dtype.name}, shape={tensor.shape}"
        )
    with tf.control_dependencies(None):
        received = tf.identity(tensor, name=name)
    tf.compat.v1.add_to_collection(COLLECTION, received.op)
    return received


def _device(op) -> str:
    return tf.DeviceSpec.from_string(op.device or "").to_string()


def _stages(receivers) -> dict[str, int]:
    """Each receiving op's stage: 1 + the largest stage of the receivers upstream of it."""
    mark = {op.name for op in receivers}
    best: dict[str, int] = {}  # op name -> largest stage at or above it
    entered: set[str] = set()
    for root in receivers:
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if op.name in best:
                continue
            parents = [t.op for t in op.inputs] + list(op.control_inputs)
            if expanded:
                up = max((best.get(p.name, 0) for p in parents), default=0)
                best[op.name] = up + 1 if op.name in mark else up
                continue
            if op.name in entered:  # a loop's back edge: nothing more above it
                continue
            entered.add(op.name)
            stack.append((op, True))
            stack.extend((p, False) for p in parents if p.name not in best)
    return {op.name: best[op.name] for op in receivers}


def batch(graph: tf.Graph | None = None) -> int:
    """Merges the registered transfers of `graph` (see module docstring).

    Call it once the step is built and before any session runs `graph`; the
    transfers it merged are forgotten (a second call merges what was
    registered since).

    Returns:
      The number of transfers merged into others (0: nothing to merge).
    """
    graph = graph or tf.compat.v1.get_default_graph()
    registered = graph.get_collection_ref(COLLECTION)
    receivers = list(registered)
    del registered[:]
    if not receivers:
        return 0
    stages = _stages(receivers)
    groups: dict[tuple, list] = {}
    for op in receivers:
        source = op.inputs[0]
        key = (_device(op), _device(source.op), source.dtype, stages[op.name])
        groups.setdefault(key, []).append(op)
    merged = 0
    with graph.as_default(), tf.name_scope("npu_rec_ps_batch"):
        for (to_device, from_device, dtype, _), ops in sorted(
            groups.items(), key=lambda item: (item[0][3], item[0][0], item[0][1])
        ):
            if len(ops) > 1:
                _merge(ops, to_device, from_device, dtype)
                merged += len(ops) - 1
    return merged


def _merge(receivers, to_device: str, from_device: str, dtype) -> None:
    """One crossing for `receivers` (ops on `to_device` reading 1-D tensors of `from_device`)."""
    sources = [op.inputs[0] for op in receivers]
    n = len(sources)
    with tf.control_dependencies(None):
        with tf.compat.v1.device(from_device):
            sizes = tf.stack([tf.size(s, out_type=tf.int64) for s in sources])
            header = sizes if dtype == tf.int64 else tf.reshape(tf.bitcast(sizes, dtype), [-1])
            packed = tf.concat([header, *sources], 0, name="packed")
        with tf.compat.v1.device(to_device):
            received = tf.identity(packed, name="received")
            width = 1 if dtype == tf.int64 else 2
            head = received[: n * width]
            sizes = head if dtype == tf.int64 else tf.bitcast(tf.reshape(head, [n, 2]), tf.int64)
            pieces = tf.split(received[n * width :], sizes, num=n)
    for op, piece in zip(receivers, pieces, strict=True):
        rewire_input(op, 0, piece)
