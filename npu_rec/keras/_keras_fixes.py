"""Workarounds for Keras 3 bugs under `MultiWorkerMirroredStrategy`, fenced in one place.

Keras 3 (checked: 3.15.1, TensorFlow backend) cannot run `fit` under a
multi-worker strategy (keras-team/keras#20585):

1. `_maybe_symbolic_build` takes the first batch and reduces it across
   replicas with `strategy.reduce("MEAN", batch)`; a batch that is a dict (or
   any nest) of `PerReplica` values fails to convert to a tensor. RecModel
   builds its optimizer and metric state from the dataset's element spec
   instead, inside the strategy's scope (`symbolic_build`).
2. `reduce_per_replica` reduces the step's logs with
   `strategy.reduce("MEAN", v, axis=0)` (the reduction is fixed to "auto" in
   `_make_function`), which fails for scalar logs. RecModel's steps return
   their scalar logs with shape [1] under a multi-worker strategy
   (`logs_for_reduction`); the reduction then averages them over the workers.

`tests/keras/test_keras_fixes.py` checks that the installed Keras still has
both bugs: when it fails, Keras has fixed one, and its workaround can go.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec import _keras_private
from npu_rec import _log as logging
from npu_rec._keras_private import unscale_loss_for_distribution


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
                _keras_private.symbolic_build(model, spec)
            except Exception as err:  # noqa: BLE001 - the optimizer is built below
                logging.info("npu_rec: symbolic build from the data spec failed (%s).", err)
        # Variables made at the first trace would be made inside Keras' `tf.cond` over the
        # iterator, which a multi-worker step cannot run (their initial values become
        # unfed placeholders): build the optimizer's slots now.
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built and model.built:
            optimizer.build(model.trainable_variables)


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
