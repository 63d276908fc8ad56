"""npu_bridge's `util` (`npu_bridge.estimator.npu.util`) on npu_rec."""

from __future__ import annotations

from npu_rec import _log as logging

_warned = False


def set_iteration_per_loop(sess, train_op, iterations_per_loop=1):
    """Returns `train_op` unchanged: one `sess.run` is one step on npu_rec.

    On an NPU one run loops `iterations_per_loop` steps on the device; on a
    CPU there is no device loop, so a program counting steps as
    `runs * iterations_per_loop` counts too many. Logged once.
    """
    global _warned
    if iterations_per_loop != 1 and not _warned:
        _warned = True
        logging.warning(
            "npu_rec: set_iteration_per_loop(%s) has no CPU meaning; each sess.run runs one step.",
            iterations_per_loop,
        )
    return train_op


def npu_hooks_append(hooks_list=()):
    """npu_bridge's hook list helper: the hooks as a list (no NPU hooks to add)."""
    return list(hooks_list or [])
