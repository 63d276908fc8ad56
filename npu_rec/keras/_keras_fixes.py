"""Workarounds for Keras 3 bugs under `MultiWorkerMirroredStrategy`, fenced in one place.

Keras 3 (checked: 3.15.1, TensorFlow backend) cannot run `fit` under a
multi-worker strategy (keras-team/keras#20585):

1. `_maybe_symbolic_build` takes the first batch and reduces it across
   replicas with `strategy.reduce("MEAN", batch)`; a batch that is a dict (or
   any nest) of `PerReplica` values fails to convert to a tensor. RecModel
   builds its optimizer and metric state from the dataset's element spec
   instead (one replica's spec of its per-replica specs), inside the
   strategy's scope (`symbolic_build`), with the sharded tables' lookups
   answering zeros (Keras calls the model outside a replica step, in a graph
   that never runs). Metric variables created at the first trace instead would
   be unfed placeholders in the multi-worker step.
2. `reduce_per_replica` reduces the step's logs with
   `strategy.reduce("MEAN", v, axis=0)` (the reduction is fixed to "auto" in
   `_make_function`), which fails for scalar logs. `logs_for_reduction`
   returns scalar logs with shape [1] under a multi-worker strategy, so that
   the reduction averages them over the workers. (RecModel's training and
   evaluation steps do not go through that reduction there, see below.)

Beyond the bugs, Keras' train function costs two all-reduces per log and step
under the strategy (`reduce_per_replica`'s MEAN is a SUM of the values, then
one of the counts), on top of the optimizer's all-reduce of the gradients.
`RecModel` makes its own train function there (`train_function`): the step
sums its dense gradients and its logs over the workers in one all-reduce
(`all_reduce_with_logs`), divides the logs by the number of workers (the mean
Keras computes) and applies the summed gradients with the optimizer's own
reduction skipped; the function returns the step's logs as they are. Its
test function (`test_function`) likewise: the evaluation step averages its
logs in one all-reduce (`reduced_logs`).

`tests/keras/test_keras_fixes.py` checks that the installed Keras still has
both bugs: when it fails, Keras has fixed one, and its workaround can go.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec import _keras_private
from npu_rec import _log as logging
from npu_rec._keras_private import unscale_loss_for_distribution
from npu_rec.distribute import _step_exchange


def multi_worker(strategy) -> bool:
    """True under a `MultiWorkerMirroredStrategy` with more than one replica."""
    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.num_replicas_in_sync > 1
    )


def unscale_loss(loss):
    """The loss of this replica's batch: Keras divides compiled losses by the replicas."""
    return unscale_loss_for_distribution(loss)


def symbolic_build(model, strategy, spec) -> None:
    """Builds `model`'s optimizer, loss and metrics from a batch spec, in `strategy`'s scope.

    Args:
      model: A compiled Keras model.
      strategy: The model's distribution strategy.
      spec: The `tf.TensorSpec` nest of one replica's batch, or None (then Keras
        builds at the first trace of the step).
    """
    with strategy.scope():
        if spec is not None:
            try:
                # Keras calls the model outside a replica step, in a graph that never runs.
                with _step_exchange.shapes_only():
                    _keras_private.symbolic_build(model, spec)
            except Exception as err:  # noqa: BLE001 - the optimizer is built below
                logging.info("npu_rec: symbolic build from the data spec failed (%s).", err)
        # Variables made at the first trace would be made inside Keras' `tf.cond` over the
        # iterator, which a multi-worker step cannot run (their initial values become
        # unfed placeholders): build the optimizer's slots now.
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built and model.built:
            optimizer.build(model.trainable_variables)


def reduced_logs(logs):
    """The step's logs averaged over the workers in one all-reduce (an evaluation step's)."""
    return all_reduce_with_logs([], logs)[1]


def logs_for_reduction(logs):
    """Scalar logs as shape [1] under a multi-worker strategy (inside the replica step).

    Keras reduces the replicas' logs with `strategy.reduce("MEAN", v, axis=0)`:
    over [1] values that is the mean across the workers, a scalar.
    """
    if not multi_worker(tf.distribute.get_strategy()):
        return logs

    def lift(value):
        value = tf.convert_to_tensor(value)
        return value[None] if value.shape.rank == 0 else value

    return tf.nest.map_structure(lift, logs)


def train_function(model):
    """A train function with Keras' contract whose logs the step has already reduced.

    Under a multi-worker strategy (one step per call), the function runs
    `model.train_step` under `strategy.run` and returns the logs of this
    worker's replica as they are: the step summed them over the workers with
    its dense gradients (`all_reduce_with_logs`). Called with the epoch's
    iterator, it returns the step's logs; at the end of the data it raises as
    Keras' function does (`tf.errors.OutOfRangeError` from the iterator,
    `StopIteration` from a Python iterator).
    """
    return step_function(model, model.train_step)


def test_function(model):
    """`train_function` for `model.test_step`, whose logs take one all-reduce in the step."""
    return step_function(model, model.test_step)


def step_function(model, step):
    """Keras' step-function contract for `step`, whose logs the step reduces itself."""
    strategy = model.distribute_strategy

    def one_step_on_data(data):
        outputs = strategy.run(step, args=(data,))
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], outputs)

    def one_step_on_iterator(iterator):
        return one_step_on_data(iterator.get_next())

    if not model.run_eagerly:
        one_step_on_data = tf.function(one_step_on_data, reduce_retracing=True)
        one_step_on_iterator = tf.function(one_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return one_step_on_iterator(iterator)
        return one_step_on_data(next(iter(iterator)))

    return function


def all_reduce_with_logs(grads, logs):
    """Dense gradients summed and logs averaged over the workers, in one all-reduce.

    Inside a replica step of a multi-worker strategy. The strategy packs the
    float32 tensors of one `all_reduce` call into one collective, so the logs
    (cast to float32) ride along with float32 gradients; with gradients of
    another dtype they take an all-reduce of their own. Each log becomes the
    mean of the workers' values, as Keras' `strategy.reduce("MEAN", v, axis=0)`
    over one value per worker computes it.

    Args:
      grads: The dense gradients (tensors, `IndexedSlices` or None).
      logs: The step's logs, a nest of tensors.

    Returns:
      (the gradients summed, None where None; the logs averaged, same nest).
    """
    ctx = tf.distribute.get_replica_context()
    flat_logs = [tf.convert_to_tensor(v) for v in tf.nest.flatten(logs)]
    values = [tf.cast(v, tf.float32) for v in flat_logs]
    present = [g for g in grads if g is not None]
    if all(g.dtype == tf.float32 for g in present if not isinstance(g, tf.IndexedSlices)):
        reduced = ctx.all_reduce("SUM", present + values) if present or values else []
        summed_grads, summed_logs = reduced[: len(present)], reduced[len(present) :]
    else:
        summed_grads = ctx.all_reduce("SUM", present) if present else []
        summed_logs = ctx.all_reduce("SUM", values) if values else []
    workers = float(ctx.num_replicas_in_sync)
    means = [tf.cast(s / workers, v.dtype) for s, v in zip(summed_logs, flat_logs, strict=True)]
    it = iter(summed_grads)
    out_grads = [None if g is None else next(it) for g in grads]
    return out_grads, tf.nest.pack_sequence_as(logs, means)
