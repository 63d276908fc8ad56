"""`SyntheticSource`: `SyntheticCriteo` rows as a sharded, checkpointable minibatch source.

Rows are a pure function of their index, so each worker generates only its
own share (the blocks of 4096 rows it touches, a few of them cached), and the
checkpoint state is just the sweep and the position.
"""

from __future__ import annotations

import collections

import numpy as np

from npu_rec.data._convert import column_streams
from npu_rec.data._source import (
    STATE_VERSION,
    MinibatchData,
    MinibatchSource,
    StreamInformation,
    check_sharding,
)
from npu_rec.data._synthetic import BLOCK_ROWS, CATEGORICAL_NAMES, DENSE_NAMES, SyntheticCriteo

_CACHED_BLOCKS = 8


class SyntheticSource(MinibatchSource):
    """A minibatch source over `SyntheticCriteo` rows: endless, or sized.

    Streams: `label` (float32), `I1`-`I13` (float32), `C1`-`C26` (raw int64
    ids), each `[n]`. Row `i` of every sweep is row `i` of the generator.
    Sharding follows the other sources (a global chunk of `num_samples *
    number_of_workers` rows split evenly by rank), but a worker generates only
    its own rows.

    Args:
      num_rows: rows per sweep (>= 1); None for an endless stream (no sweep ends).
      seed: the generator's seed.
      **generator_kwargs: further `SyntheticCriteo` arguments.

    Example:
      >>> src = SyntheticSource(num_rows=10_000, seed=7)
      >>> mb = src.next_minibatch(1024, number_of_workers=2, worker_rank=0)
    """

    def __init__(self, num_rows: int | None = None, *, seed: int = 0, **generator_kwargs):
        if num_rows is not None and (
            isinstance(num_rows, bool)
            or not isinstance(num_rows, (int, np.integer))
            or num_rows < 1
        ):
            raise ValueError(
                f"`num_rows` must be None or an integer >= 1. Received: num_rows={num_rows!r}"
            )
        self.num_rows = None if num_rows is None else int(num_rows)
        self.generator = SyntheticCriteo(seed=seed, **generator_kwargs)
        self.label_name = "label"
        self._name = f"synthetic:seed={seed},num_rows={num_rows},{sorted(generator_kwargs.items())}"
        self._streams = column_streams("label", DENSE_NAMES, CATEGORICAL_NAMES, ())
        self._sweep = 0
        self._position = 0
        self._blocks = collections.OrderedDict()

    def stream_infos(self) -> list[StreamInformation]:
        return list(self._streams)

    def next_minibatch(self, num_samples, number_of_workers=1, worker_rank=0):
        b, w, r = check_sharding(num_samples, number_of_workers, worker_rank)
        chunk = b * w
        if self.num_rows is None:
            m, sweep_end = chunk, False
        else:
            left = self.num_rows - self._position
            m, sweep_end = min(chunk, left), left <= chunk
        lo, hi = r * m // w, (r + 1) * m // w
        rows = self._rows(self._position + lo, self._position + hi)
        if sweep_end:
            self._sweep, self._position = self._sweep + 1, 0
        else:
            self._position += m
        n = hi - lo
        return {s: MinibatchData(rows[s.name], n, n, sweep_end) for s in self._streams}

    def get_checkpoint_state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "source": "SyntheticSource",
            "files": [self._name],
            "sweep": self._sweep,
            "position": self._position,
        }

    def restore_from_checkpoint(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"`state` must be a dict from get_checkpoint_state() (version {STATE_VERSION}). "
                f"Received: state={state!r}"
            )
        if state.get("source") != "SyntheticSource" or state.get("files") != [self._name]:
            raise ValueError(
                f"`state` was saved by a different source: saved {state.get('source')} over "
                f"{state.get('files')}, restoring into SyntheticSource over {[self._name]}"
            )
        self._sweep, self._position = int(state["sweep"]), int(state["position"])

    def error_report(self) -> dict:
        """Generated rows are never malformed: `{"count": 0, "examples": []}`."""
        return {"count": 0, "examples": []}

    def _block(self, index: int) -> dict:
        if index not in self._blocks:
            rows = self.generator.rows(index * BLOCK_ROWS, (index + 1) * BLOCK_ROWS)
            rows["label"] = rows["label"].astype(np.float32)
            self._blocks[index] = rows
            while len(self._blocks) > _CACHED_BLOCKS:
                self._blocks.popitem(last=False)
        return self._blocks[index]

    def _rows(self, start: int, stop: int) -> dict:
        if stop <= start:
            return {s.name: np.zeros([0], s.dtype) for s in self._streams}
        parts = []
        for index in range(start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS + 1):
            block = self._block(index)
            a = max(start - index * BLOCK_ROWS, 0)
            z = min(stop - index * BLOCK_ROWS, BLOCK_ROWS)
            parts.append({k: v[a:z] for k, v in block.items()})
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
