"""`eval_metric_ops` as `(value, update_op)` pairs, as tf.estimator read them.

A value of `eval_metric_ops` is either the pair a `tf.compat.v1.metrics`
function returns or a metric object on which the `model_fn` called
`update_state(...)`: a Keras 3 `keras.metrics.Metric` or a tf_keras one. A
metric object becomes `(metric.result(), update_op)`. tf_keras metrics list
their update ops (`metric.updates`); a Keras 3 metric does not, so its update
op is the group of the ops `update_state` added to this graph that write its
variables (the variables' initializers excluded), each made to wait for the
loss (see `_after`). The metric's variables move
from the global to the local (and metric) variables, as tf.estimator did, so
they are not saved in checkpoints and start from zero in every evaluation.
"""

from __future__ import annotations

import tensorflow as tf

#: Op types that write a resource variable.
_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
_RESERVED = ("loss", "global_step")


def is_metric_object(value) -> bool:
    """Whether `value` looks like a Keras (3 or tf_keras) metric object."""
    return hasattr(value, "result") and hasattr(value, "variables") and callable(value.result)


def _tf_variable(v) -> tf.Variable:
    """The `tf.Variable` behind a Keras 3 variable (or `v` itself)."""
    return v if isinstance(v, tf.Variable) else v.value


def _update_op(name: str, metric, variables, after):
    updates = list(getattr(metric, "updates", None) or [])
    if not updates:
        initializers = {v.initializer for v in variables}
        writes = list(
            dict.fromkeys(
                op
                for v in variables
                for op in v.handle.consumers()
                if op.type in _WRITES and op not in initializers
            )
        )
        updates = [_after(op, after) for op in writes]
    if not updates:
        raise ValueError(
            f"`eval_metric_ops[{name!r}]` is a metric object whose "
            "update_state(...) was never called in the model_fn; call it on "
            f"the batch's labels / predictions. Received: {metric!r}"
        )
    return tf.group(*updates, name=f"{name}_update")


def _after(write: tf.Operation, after):
    """The variable write `write`, made again to run only once `after` is computed.

    Keras 3 may compute an update from static shapes alone (a metric's count
    from a constant), so the write does not wait for the batch: on the run
    where the input ends, it would still count a batch that never came. The
    copy waits for `after` (the loss, which needs the batch); the original is
    never run.
    """
    if after is None:
        return write
    with tf.control_dependencies([after]):
        return getattr(tf.raw_ops, write.type)(resource=write.inputs[0], value=write.inputs[1])


def _make_local(variables) -> None:
    graph = tf.compat.v1.get_default_graph()
    ids = {id(v) for v in variables}
    for key in (
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
    ):
        ref = graph.get_collection_ref(key)
        ref[:] = [v for v in ref if id(v) not in ids]
    for key in (tf.compat.v1.GraphKeys.LOCAL_VARIABLES, tf.compat.v1.GraphKeys.METRIC_VARIABLES):
        present = {id(v) for v in graph.get_collection(key)}
        for v in variables:
            if id(v) not in present:
                graph.add_to_collection(key, v)


def metric_pairs(eval_metric_ops, after=None) -> dict:
    """`eval_metric_ops` with every metric object turned into `(value, update_op)`.

    Args:
      eval_metric_ops: The spec's dict, or None.
      after: A tensor the batch's metric updates must wait for (the loss), or None.

    Raises:
      TypeError: `eval_metric_ops` is not a dict, or a value is neither a pair
        nor a metric object.
      ValueError: a name is reserved ("loss", "global_step"), or a metric
        object was never updated.
    """
    if eval_metric_ops is None:
        return {}
    if not isinstance(eval_metric_ops, dict):
        raise TypeError(
            "`eval_metric_ops` must be a dict of name -> (value, update_op) or "
            f"metric object. Received: eval_metric_ops={eval_metric_ops!r}"
        )
    pairs = {}
    for name, m in eval_metric_ops.items():
        if name in _RESERVED:
            raise ValueError(
                f"`eval_metric_ops` may not use the name {name!r}: the "
                "Estimator reports it itself. Rename the metric."
            )
        if isinstance(m, tuple) and len(m) == 2:
            pairs[name] = m
        elif is_metric_object(m):
            variables = [_tf_variable(v) for v in m.variables]
            pairs[name] = (m.result(), _update_op(name, m, variables, after))
            _make_local(variables)
        else:
            raise TypeError(
                f"`eval_metric_ops[{name!r}]` must be a (value, update_op) pair "
                f"or a Keras metric object. Received: {m!r}"
            )
    return pairs
