"""The Scaffold of an Estimator session: npu_rec's restore and the model_fn's `scaffold`.

npu_rec restores a checkpoint (dense variables, then the tables of the same
step) in the Scaffold's `init_fn`, after the `init_op`. The `scaffold` of the
`EstimatorSpec` is honoured as tf.estimator did:

- `saver`: writes and restores the dense checkpoint in place of npu_rec's
  Saver over the non-table variables (the sparse tables are still saved
  next to it, at the same step); export restores with it too.
- `init_fn(scaffold, session)`: runs only when no checkpoint is restored: a
  fresh `model_dir` (after warm starting, if any), in every mode; e.g. to
  load pretrained weights. A resumed training does not run it again.
- `init_op`, `init_feed_dict`, `ready_op`, `ready_for_local_init_op`,
  `local_init_op`, `local_init_feed_dict`: used by the session as given.
  In `evaluate`, `local_init_op` is grouped with the default one so the
  metrics' local variables start at zero; export runs it in the SavedModel's
  main op.
- `summary_op`: the training summaries written every `save_summary_steps`.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec.estimator._graph import checkpoint_step

Scaffold = tf.compat.v1.train.Scaffold


def user_saver(spec) -> tf.compat.v1.train.Saver | None:
    """The `saver` of `spec.scaffold`, or None.

    Raises:
      TypeError: the saver is not a `tf.compat.v1.train.Saver`.
    """
    saver = None if spec.scaffold is None else spec.scaffold.saver
    if saver is not None and not isinstance(saver, tf.compat.v1.train.Saver):
        raise TypeError(
            "`EstimatorSpec.scaffold.saver` must be a tf.compat.v1.train.Saver "
            f"(npu_rec saves the tables beside it). Received: {saver!r}"
        )
    return saver


def session_scaffold(spec, plan, saver, manager, *, evaluation=False) -> Scaffold:
    """The Scaffold a session of this graph is created with.

    Args:
      spec: The `EstimatorSpec` (its `scaffold` may be None).
      plan: The `RestorePlan` of the session.
      saver: The dense Saver (the spec's or npu_rec's).
      manager: The `TableCheckpointManager`, or None.
      evaluation: Whether the graph evaluates (metrics' local variables).
    """
    user = spec.scaffold
    if user is not None and user.saver is not None and plan.dense_path:
        checkpoint_step(plan.dense_path)  # a user's Saver must save the global step too
    restore_saver = saver
    restore = plan.init_fn(restore_saver, manager)
    init_fn = restore
    user_init = None if user is None else user.init_fn
    if user_init is not None and plan.dense_path is None:

        def init_fn(scaffold, session):
            restore(scaffold, session)
            user_init(session)

    if user is None:
        return Scaffold(saver=restore_saver, init_fn=init_fn)
    local_init_op = user.local_init_op
    if evaluation and local_init_op is not None:
        local_init_op = tf.group(local_init_op, Scaffold.default_local_init_op())
    return Scaffold(
        init_fn=init_fn, saver=restore_saver, local_init_op=local_init_op, copy_from_scaffold=user
    )


def summary_op(spec, default):
    """The training summary op: `spec.scaffold.summary_op`, else `default`."""
    user = None if spec.scaffold is None else spec.scaffold.summary_op
    return default if user is None else user


def export_local_init_op(spec):
    """The spec's `local_init_op` for the SavedModel's main op, or None."""
    return None if spec.scaffold is None else spec.scaffold.local_init_op
