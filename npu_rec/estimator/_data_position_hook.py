"""The reading position of `npu_rec.data` input functions, saved with every checkpoint.

An `input_fn` made by `npu_rec.data.as_input_fn` carries its source
(`input_fn.source`) and a `ReadingPosition` (`input_fn.reading_position`)
that records the source's checkpoint state after every batch the dataset
produced (tf.data reads ahead). `NPUEstimator.train` runs one batch per
training step, so after `k` steps of a session the model has consumed the
first `k` batches its dataset produced: the state to save is
`position.state_after(produced_before_the_session + k)`.

It is written as `model_dir/data_position-<step>.json` (with a SHA-256 of its
content, fsynced) each time the dense variables and tables are saved at
`step`, as one part of that version, and read back before a session restores
checkpoint `step`: the source continues at the first sample the restored
model has not trained on. A damaged file raises `CheckpointCorruptedError`
naming it (and the version is skipped like any damaged version). A clean stop/resume neither loses nor
repeats a sample; a run killed between checkpoints re-reads only the
samples after the last checkpoint.
"""

from __future__ import annotations

import os

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.training._data_position import (
    ConsumedBatches,
    load_position,
    restore_source,
    save_position,
)

_FILE = "data_position-{step}.json"


def tracked(input_fn):
    """`(source, position)` of an `as_input_fn` input function, or None."""
    source = getattr(input_fn, "source", None)
    position = getattr(input_fn, "reading_position", None)
    if source is None or position is None:
        return None
    return source, position


def path_for(model_dir: str, step: int) -> str:
    return os.path.join(model_dir, _FILE.format(step=step))


def restore(path: str | None, step: int | None, source) -> bool:
    """Puts `source` at the position in `path` (saved with checkpoint `step`); False if none."""
    if step is None:
        return False
    state = load_position(path) if path is not None and os.path.exists(path) else None
    if state is not None and "trainers" in state:
        logging.warning(
            "npu_rec: %s holds the positions of %d trainers of a cluster; one process "
            "reads from where its source is.",
            path,
            len(state["trainers"]),
        )
        return False
    return restore_source(source, state, step)


class DataPositionHook(tf.compat.v1.train.SessionRunHook):
    """Knows the source state after the batches this session's steps consumed.

    Args:
      position: The input function's `ReadingPosition`.
      model_dir: Where `save(step)` writes.
    """

    def __init__(self, position, model_dir: str):
        self.position, self.model_dir = position, model_dir
        self._consumed = ConsumedBatches(position)
        self._saved = {}  # step -> the state written by save(step), until committed

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._consumed.begin(int(session.run(self._global_step)))

    def end(self, session):
        self.position.stop()  # a paused stream's pending read ends before the session closes

    def state_at(self, step: int) -> dict:
        return self._consumed.state_at(step)

    def save(self, step: int) -> str | None:
        """Writes the state after the batches of steps up to `step`; returns the file or None."""
        try:
            state = self.state_at(step)
        except ValueError as error:
            logging.warning("npu_rec: no data position to save for step %d: %s", step, error)
            return None
        path = path_for(self.model_dir, step)
        save_position(path, state)
        self._saved = {step: state}
        return path

    def committed(self, step: int) -> None:
        """Tells the source that version `step`, holding the state `save(step)` wrote, is committed."""
        state = self._saved.pop(step, None)
        if state is not None:
            self.position.checkpoint_committed(state)
