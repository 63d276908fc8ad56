"""The data position both front ends save with every checkpoint.

tf.data reads ahead, so the source's own state is past what the model has
trained on. A `ReadingPosition` (`npu_rec.data.as_dataset(...).reading_position`,
`as_input_fn(...).reading_position`) records the source state after every
batch the dataset produced; `ConsumedBatches` turns "global step `s`" into
"the state after the batches consumed up to `s`", given the step and the
batches produced when this training call (Keras `fit`, Estimator session)
began: one batch per step.

The state is stored sealed (JSON with a SHA-256 of its content, see
`npu_rec.checkpoint._versions.sealed`) and written atomically
(`npu_rec._paths.write_json_atomic`): Keras as `state-<step>.json`
(`{"step", "kind", "data"}`), the Estimator as `data_position-<step>.json`
(the state itself). A damaged file raises `CheckpointCorruptedError` naming it.
"""

from __future__ import annotations

from typing import Any

from npu_rec import _log as logging
from npu_rec._paths import write_json_atomic
from npu_rec.checkpoint._versions import sealed, unseal


def save_position(path: str, payload: dict[str, Any]) -> None:
    """Writes `payload` sealed and atomically to `path`."""
    write_json_atomic(path, sealed(payload))


def load_position(path: str) -> dict[str, Any]:
    """The payload of a file written by `save_position` (refused if damaged)."""
    return unseal(path)


def restore_source(source, state: dict | None, step: int) -> bool:
    """Puts `source` at `state` (saved with checkpoint `step`); False (logged) if None."""
    if state is None:
        logging.warning(
            "npu_rec: checkpoint %d has no saved data position; the input "
            "source continues where it is.",
            step,
        )
        return False
    source.restore_from_checkpoint(state)
    logging.info("npu_rec: input source restored to the position of step %d.", step)
    return True


class ConsumedBatches:
    """The source state after the batches a training call's steps consumed.

    Args:
      position: The dataset's `ReadingPosition` (`produced`, `state_after(n)`).
    """

    def __init__(self, position):
        self.position = position
        self.start_step = 0
        self.start_batches = 0

    def begin(self, step: int) -> None:
        """A training call starts at global step `step` with the batches produced so far."""
        self.start_step = step
        self.start_batches = self.position.produced

    def consumed(self, step: int) -> int:
        """Batches this call has trained on by global step `step`."""
        return step - self.start_step

    def state_at(self, step: int) -> dict:
        """The source state after the batches trained up to global step `step`."""
        return self.position.state_after(self.start_batches + self.consumed(step))
