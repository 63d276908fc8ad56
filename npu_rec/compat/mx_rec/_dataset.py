"""mx_rec's `Dataset.eos_map`, added to `tf.data.Dataset` when the compat package is imported.

mx_rec's end-of-sequence dataset makes every rank see the end of its data at the
same step, so that no rank waits on a collective the others never join. npu_rec
runs one process, so `eos_map` returns the dataset as it is (same elements, same end).
"""

from __future__ import annotations

import tensorflow as tf


def _eos_map(self, librec=None, channel_id=0, max_train_steps=None, max_eval_steps=None):
    """mx_rec's `Dataset.eos_map(librec, channel_id, max_train_steps, max_eval_steps)`:
    one rank, so the dataset itself (arguments accepted and unused)."""
    del librec, channel_id, max_train_steps, max_eval_steps
    return self


def patch() -> None:
    """Gives `tf.data.Dataset` (v1 datasets included) an `eos_map` method, unless it has one."""
    if not hasattr(tf.data.Dataset, "eos_map"):
        tf.data.Dataset.eos_map = _eos_map
