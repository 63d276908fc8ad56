"""One Estimator save: every part of a version written and fsynced, then its commit record.

The order is that of `npu_rec.checkpoint._training_dir` (docs/design.md,
"Committed versions"): the data position (`data_position-<step>.json`), the
dense variables (`model.ckpt-<step>.*`, written by the Saver with
`write_state=False`, so TensorFlow's `checkpoint` pointer is not moved yet),
the tables (`tables/ckpt-<step>.<kind>.nrc`), then the commit record, and only
then the `checkpoint` pointer. A write that raises (a full disk, a failed table
check) removes the parts written so far and publishes nothing: the previous
version stays the newest.
"""

from __future__ import annotations

import glob
import os

from npu_rec.checkpoint._file_format import fsync_path
from npu_rec.checkpoint._training_dir import TrainingDir
from npu_rec.estimator._graph import update_checkpoint_pointer


def save_version(
    tdir: TrainingDir,
    session,
    saver,
    manager,
    step: int,
    delta: bool,
    data_position=None,
    state: dict | None = None,
) -> str:
    """Writes and commits version `step`; returns its kind ("full" or "delta").

    Args:
      tdir: The model_dir opened for training.
      session: The training session.
      saver: The dense `tf.compat.v1.train.Saver`.
      manager: The `TableCheckpointManager`, or None (no tables).
      step: The global step.
      delta: Whether the tables save a delta (made full when there is no base).
      data_position: The `DataPositionHook`, or None.
      state: Small JSON-able state stored in the commit record (precision switch).
    """
    model_dir = tdir.directory
    prefix = os.path.join(model_dir, f"model.ckpt-{step}")
    parts: list[str] = []
    # Without tables a version is its dense state alone: always self-contained.
    kind = "delta" if delta and tdir.parent is not None and manager is not None else "full"
    try:
        if data_position is not None:
            path = data_position.save(step)
            if path is not None:
                parts.append(os.path.basename(path))
        saver.save(session, prefix, write_meta_graph=False, write_state=False)
        for path in sorted(glob.glob(prefix + ".index") + glob.glob(prefix + ".data-*")):
            fsync_path(path)
            parts.append(os.path.basename(path))
        if manager is None:
            tdir.commit(step, kind, parts, state=state)
        else:

            def commit(path):
                nonlocal kind
                kind = "delta" if path.endswith(".delta.nrc") else "full"
                parts.append(os.path.relpath(path, model_dir))
                tdir.commit(step, kind, parts, state=state)

            manager.save(step, delta=kind == "delta", session=session, commit=commit)
    except BaseException:
        tdir.discard(
            parts
            + [
                f"model.ckpt-{step}.index",
                f"model.ckpt-{step}.data-00000-of-00001",
                f"data_position-{step}.json",
            ]
        )
        raise
    committed = getattr(data_position, "committed", None)  # a trainer of a cluster has none
    if committed is not None:
        committed(step)
    update_checkpoint_pointer(model_dir)
    return kind
