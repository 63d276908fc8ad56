"""The minibatch-source contract (CNTK's UserMinibatchSource).

A `MinibatchSource` has four methods: `stream_infos()`, `next_minibatch()`,
`get_checkpoint_state()` and `restore_from_checkpoint()`, and `close()`. The
built-in file sources share `RowSource` (`_row_source.py`).
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from npu_rec import _validation

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class StreamInformation:
    """Meta information of one stream (column) of a source.

    Args:
      name: the stream's name (for file sources: the column name).
      stream_id: its index in `stream_infos()`.
      storage_format: "dense" (one value per sample) or "ragged" (a variable
        number of ids per sample, given as a `tf.RaggedTensor`).
      dtype: NumPy dtype of the values (`float32` or `int64`).
      shape: shape of one sample: `()` for dense, `(None,)` for ragged.
    """

    name: str
    stream_id: int
    storage_format: str
    dtype: np.dtype
    shape: tuple

    def __post_init__(self):
        if self.storage_format not in ("dense", "ragged"):
            raise ValueError(
                "`storage_format` must be 'dense' or 'ragged'. "
                f"Received: storage_format={self.storage_format!r}"
            )
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(self.shape))


@dataclasses.dataclass(frozen=True)
class MinibatchData:
    """One stream's part of a minibatch.

    Args:
      data: NumPy array `[n]` (dense streams) or `tf.RaggedTensor` `[n, None]`
        (ragged streams).
      num_sequences: `n`, the number of samples (rows).
      num_samples: `n` as well: a sample is one example (row).
      sweep_end: True for the last minibatch of a sweep.
    """

    data: object
    num_sequences: int
    num_samples: int
    sweep_end: bool


def tell_committed(source, state: dict) -> None:
    """Calls `source.checkpoint_committed(state)` where the source has it.

    The CNTK contract a user's own source may follow has four methods only
    (`stream_infos`, `next_minibatch`, `get_checkpoint_state`,
    `restore_from_checkpoint`); such a source has nothing to tell a broker.
    """
    committed = getattr(source, "checkpoint_committed", None)
    if committed is not None:
        committed(state)


class MinibatchSource(abc.ABC):
    """The four-method contract every npu_rec data source implements."""

    @abc.abstractmethod
    def stream_infos(self) -> list[StreamInformation]:
        """Returns the streams of this source, in `stream_id` order."""

    @abc.abstractmethod
    def next_minibatch(
        self, num_samples: int, number_of_workers: int = 1, worker_rank: int = 0
    ) -> dict[StreamInformation, MinibatchData]:
        """Returns this worker's share of the next `num_samples * number_of_workers` rows."""

    @abc.abstractmethod
    def get_checkpoint_state(self) -> dict:
        """Returns the reading position as a JSON-serialisable dict."""

    @abc.abstractmethod
    def restore_from_checkpoint(self, state: dict) -> None:
        """Continues reading from a position returned by `get_checkpoint_state()`."""

    def checkpoint_committed(self, state: dict) -> None:
        """Called by the front ends once a checkpoint holding `state` is committed.

        A stream source tells its broker the offsets there (never earlier); the
        default does nothing.
        """
        return None

    def close(self) -> None:
        """Frees what the source holds open (files, threads); the position is kept.

        Reading again after `close()` reopens the files where reading stopped.
        Call it (or use the source as a context manager) when done with a source:
        sources never stop threads from a finaliser, so an abandoned source's
        thread ends only once the garbage collector has freed the source.
        """
        return None  # the default: nothing held open

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def stream(self, name: str) -> StreamInformation:
        """Returns the stream called `name`."""
        for info in self.stream_infos():
            if info.name == name:
                return info
        names = [s.name for s in self.stream_infos()]
        raise KeyError(f"No stream named {name!r}; the streams are {names}")


def check_int(name: str, value, low: int) -> int:
    """`value` as an int >= `low` (the rule of `npu_rec._validation.check_int`)."""
    return _validation.check_int(name, value, low, None)


def check_sharding(num_samples, number_of_workers, worker_rank) -> tuple[int, int, int]:
    """Validates the arguments of `next_minibatch`."""
    b = check_int("num_samples", num_samples, 1)
    w = check_int("number_of_workers", number_of_workers, 1)
    r = check_int("worker_rank", worker_rank, 0)
    if r >= w:
        raise ValueError(
            "`worker_rank` must be < `number_of_workers`. "
            f"Received: worker_rank={r}, number_of_workers={w}"
        )
    return b, w, r
