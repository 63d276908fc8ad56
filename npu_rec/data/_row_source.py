"""`RowSource`: the machinery shared by the built-in file sources.

`RowSource` turns a format-specific reader (a generator of column blocks, each
able to say where it can be reopened) into sharded, sweep-aware, checkpointable
minibatches, and checks the values every format shares (finite labels and dense
values, `label_domain`):

- Rows are numbered `0..N-1` within a sweep (a pass over all files in order).
- A call with `num_samples=b` and `number_of_workers=W` covers the next global
  chunk of `b * W` rows; worker `r` takes rows `[r*m//W, (r+1)*m//W)` of it,
  where `m` is the chunk's size (`b * W`, or fewer at the end of a sweep). So
  over a sweep the workers together read every row exactly once, and their
  shares differ by at most one row.
- A chunk never crosses a sweep boundary: the call that reaches the end of the
  data returns `sweep_end=True` (maybe a short or even empty minibatch) and
  the next call starts the next sweep.
- The checkpoint state (a small JSON-serialisable dict) names the sweep, the
  global position and where to reopen the files, so a new process continues
  at the next unread row.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import os
from collections.abc import Iterator

import numpy as np

from npu_rec.data import _columns as C
from npu_rec.data import _convert
from npu_rec.data._errors import ErrorLog
from npu_rec.data._source import (
    STATE_VERSION,
    MinibatchData,
    MinibatchSource,
    StreamInformation,
    check_int,
    check_sharding,
)

_logger = logging.getLogger("npu_rec.data")

FINGERPRINT_BYTES = 64 << 10  # hashed at each end of a file


def fingerprint(path: str) -> dict:
    """A cheap fingerprint of a file: its size and a hash of its first and last 64 KiB.

    Stored with a reading position (which is a place inside one file), so a file
    truncated, appended to or rewritten since is noticed on restore. It reads at most
    128 KiB, whatever the file's size; a same-size change in the middle of a file
    larger than that goes unnoticed.
    """
    size = os.path.getsize(path)
    digest = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        digest.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(size - FINGERPRINT_BYTES, FINGERPRINT_BYTES))
            digest.update(f.read())
    return {"size": size, "hash": digest.hexdigest()}


def check_label_domain(label_domain) -> tuple | None:
    """None (any finite label), or the allowed label values as a sorted tuple of floats."""
    if label_domain is None:
        return None
    try:
        values = sorted({float(v) for v in label_domain})
    except (TypeError, ValueError):
        values = []
    if not values or not np.isfinite(values).all():
        raise ValueError(
            "`label_domain` must be None or a non-empty collection of finite numbers, e.g. "
            f"(0, 1). Received: label_domain={label_domain!r}"
        )
    return tuple(values)


class RowSource(MinibatchSource):
    """Shards, sweeps and checkpoints the rows of a format-specific reader.

    The constructor takes what every file format shares (the files, the
    column roles, the error policy) and sets `self._files`, `self._roles`
    (label, dense, categorical, multi-valued), `self.label_name`,
    `self._wanted` (the columns to read) and `self._streams` (list of
    StreamInformation). Subclasses add their format's options and implement
    `_open(loc, min_row)`: a generator of
    `(columns, rownums, loc)` blocks starting at the block that `loc` names
    (`None` for the start of the data), with rows whose number is below
    `min_row` left out. `rownums` are int64 numbers that increase within a file
    (CSV line numbers, record or row indices); `loc` is a JSON-able dict.
    """

    unit = "row"  # how errors name a record: "line" (CSV), "row" (Parquet), "record" (TFRecord)

    def __init__(
        self,
        paths,
        *,
        label: str,
        dense=(),
        categorical=(),
        multi_valued=(),
        on_error: str = "raise",
        label_domain=None,
        log_dense: bool = False,
        check_options=None,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(
                f"`on_error` must be 'raise' or 'skip'. Received: on_error={on_error!r}"
            )
        self._roles = _convert.check_columns(label, dense, categorical, multi_valued)
        self.label_name = label
        if check_options is not None:
            check_options()  # the format's own argument checks, before touching files
        self._files = _convert.expand_paths(paths)
        self._wanted = [label, *self._roles[1], *self._roles[2], *self._roles[3]]
        self._streams = _convert.column_streams(*self._roles)
        self.label_domain = check_label_domain(label_domain)
        self._log_dense = bool(log_dense)
        self._on_error = on_error
        self._errors = ErrorLog(on_error)
        self._sweep = 0
        self._position = 0
        self._resume = None  # (loc, min_row) where the next unread row is found
        self._split = None  # (part, every): see split()
        self._reset_buffer()

    # -- the contract -----------------------------------------------------

    def stream_infos(self) -> list[StreamInformation]:
        return list(self._streams)

    def next_minibatch(self, num_samples, number_of_workers=1, worker_rank=0):
        b, w, r = check_sharding(num_samples, number_of_workers, worker_rank)
        chunk = b * w
        self._fill(chunk + 1)
        m = min(chunk, self._buffered)
        sweep_end = self._buffered <= chunk and self._exhausted
        if sweep_end and self._position == 0 and m == 0:
            raise ValueError(self._empty_message())
        lo, hi = r * m // w, (r + 1) * m // w
        cols = self._take(m, lo, hi)
        if sweep_end:
            self._end_sweep()
        else:
            self._position += m
        n = hi - lo
        return {
            info: MinibatchData(C.to_output(cols[info.name]), n, n, sweep_end)
            for info in self._streams
        }

    def get_checkpoint_state(self) -> dict:
        loc, min_row = self._resume if self._resume is not None else (None, 0)
        fp = self._fingerprint_of(loc)
        return {
            "version": STATE_VERSION,
            "source": type(self).__name__,
            "files": list(self._files),
            "sweep": self._sweep,
            "position": self._position,
            "loc": loc,
            "min_row": int(min_row),
            "errors": self._errors.get_state(self._is_ahead),
            **({"split": list(self._split)} if self._split else {}),
            **({"fingerprint": fp} if fp else {}),
        }

    def restore_from_checkpoint(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"`state` must be a dict from get_checkpoint_state() (version {STATE_VERSION}). "
                f"Received: state={state!r}"
            )
        saved = [os.path.basename(f) for f in state.get("files") or []]
        if state.get("source") != type(self).__name__ or saved != [
            os.path.basename(f) for f in self._files
        ]:
            raise ValueError(
                "`state` was saved by a different source: saved "
                f"{state.get('source')} over {state.get('files')}, restoring into "
                f"{type(self).__name__} over {list(self._files)}"
            )
        saved_split = tuple(state["split"]) if state.get("split") else None
        if saved_split != self._split:
            raise ValueError(
                f"`state` was saved by a different split of the data: saved split={saved_split}, "
                f"restoring into split={self._split}"
            )
        self._sweep = int(state["sweep"])
        self._position = int(state["position"])
        self._resume = None if state["loc"] is None else (state["loc"], int(state["min_row"]))
        self._errors.set_state(state["errors"])
        self._reset_buffer()
        self._check_fingerprint(state.get("fingerprint"))

    def close(self) -> None:
        # Rows read ahead are dropped (and their malformed records forgotten, as in
        # a checkpoint): reading again reopens the files at the next unread row.
        self._errors.set_state(self._errors.get_state(self._is_ahead))
        self._reset_buffer()
        self._release()

    def split(self, part: str, every: int = 10):
        """Keeps one part of the rows: a held-out evaluation part, or the rest.

        Row `k` of a file (its CSV line number, Parquet row or TFRecord record
        index) belongs to the "eval" part when `k % every == every - 1`, else to
        "train": two sources over the same files, one of each part, never share a
        row, whatever the batch size or number of workers. Call it before reading.

        Args:
          part: "train" or "eval".
          every: one row in `every` is held out (>= 2).

        Returns:
          The source itself.

        Example:
          >>> train = CsvSource("day_0.csv", label="y", dense=["a"]).split("train")
          >>> held_out = CsvSource("day_0.csv", label="y", dense=["a"]).split("eval")
        """
        if part not in ("train", "eval"):
            raise ValueError(f"`part` must be 'train' or 'eval'. Received: part={part!r}")
        self._split = (part, check_int("every", every, 2))
        self._reset_buffer()
        return self

    # -- error reporting --------------------------------------------------

    def error_report(self) -> dict:
        """Skipped malformed records so far (with `on_error="skip"`).

        Returns:
          `{"count": int, "examples": [{"file", "row", "reason"}, ...]}`, the
          first few examples, over the whole run (restored with checkpoints).
        """
        return self._errors.report()

    # -- internals --------------------------------------------------------

    @abc.abstractmethod
    def _open(self, loc, min_row: int) -> Iterator[tuple[dict, np.ndarray, dict]]:
        """Yields `(columns, rownums, loc)` blocks (see the class docstring)."""

    def _file_index(self, loc) -> int:
        return loc.get("file", 0) if isinstance(loc, dict) else 0

    def _fingerprint_of(self, loc) -> dict | None:
        """The fingerprint of the file a reading position points into (taken once per file)."""
        if loc is None:
            return None
        i = self._file_index(loc)
        if i not in self._fingerprints:
            self._fingerprints[i] = fingerprint(self._files[i])
        return self._fingerprints[i]

    def _check_fingerprint(self, saved) -> None:
        """Warns (naming the file) when the file of a restored position changed since the save.

        A state saved before fingerprints existed restores without a check.
        """
        if not saved or self._resume is None:
            return
        i = self._file_index(self._resume[0])
        path = self._files[i]
        now = fingerprint(path)
        self._fingerprints[i] = now
        if now != saved:
            change = (
                f"size {saved.get('size')} -> {now['size']} bytes"
                if now["size"] != saved.get("size")
                else "same size, other content"
            )
            _logger.warning(
                "%s: %s changed since this reading position was saved (%s): resuming at the "
                "saved position may skip or repeat rows, or read from inside a record",
                type(self).__name__,
                path,
                change,
            )

    def _release(self) -> None:
        """Frees the format's own resources (e.g. a parsing thread); called by `close()`."""

    def _is_ahead(self, path: str, row: int) -> bool:
        """Whether a record lies at or after the next unread row (read ahead, not consumed)."""
        if self._resume is None:
            return True
        loc, min_row = self._resume
        here = loc.get("file", 0) if isinstance(loc, dict) else 0
        i = self._files.index(path) if path in self._files else -1
        return i > here or (i == here and row >= min_row)

    def _empty_message(self) -> str:
        msg = (
            f"{type(self).__name__} has no records: the files {list(self._files)} hold no data rows"
        )
        if self._split is not None:
            msg += f" in the {self._split[0]!r} part of split(every={self._split[1]})"
        if self._errors.count:
            msg += (
                f" ({self._errors.count} malformed records were skipped: {self._errors.report()})"
            )
        return msg

    def _reset_buffer(self):
        self._fingerprints = {}  # file index -> fingerprint, taken when a position needs it
        self._blocks = []  # [columns, rownums, loc, offset]
        self._buffered = 0
        self._reader = None
        self._exhausted = False

    def _fill(self, n: int):
        if self._reader is None and not self._exhausted:
            loc, min_row = self._resume if self._resume is not None else (None, 0)
            self._reader = self._open(loc, min_row)
        while self._buffered < n and not self._exhausted:
            try:
                cols, rownums, loc = next(self._reader)
            except StopIteration:
                self._exhausted = True
                self._reader = None
                break
            cols, rownums = self._check_values(loc, cols, rownums)
            if self._split is not None:
                part, every = self._split
                keep = (rownums % every == every - 1) == (part == "eval")
                if not keep.all():
                    cols, rownums = C.take_rows(cols, keep), rownums[keep]
            if len(rownums):
                self._blocks.append([cols, rownums, loc, 0])
                self._buffered += len(rownums)

    def _check_values(self, loc, cols: dict, rownums: np.ndarray):
        """Drops (reporting each) rows with a non-finite label or dense value, or a label
        outside `label_domain`; then applies `log_dense`. Formats convert values only."""
        label, dense = self._roles[0], self._roles[1]
        bad = np.zeros(len(rownums), bool)
        reasons = {}
        for c in (label, *dense):
            for j in np.flatnonzero(~np.isfinite(cols[c]) & ~bad):
                reasons[j] = f"non-finite value {cols[c][j]} in column {c!r}"
                bad[j] = True
        if self.label_domain is not None:
            domain = np.asarray(self.label_domain, np.float32)
            for j in np.flatnonzero(~np.isin(cols[label], domain) & ~bad):
                reasons[j] = (
                    f"label {label!r} = {float(cols[label][j])} is not one of "
                    f"{list(self.label_domain)} (label_domain)"
                )
                bad[j] = True
        if bad.any():
            path = self._files[self._file_index(loc)]
            for j in np.flatnonzero(bad):
                self._errors.record(path, self.unit, int(rownums[j]), reasons[j])
            cols, rownums = C.take_rows(cols, ~bad), rownums[~bad]
        if self._log_dense:
            cols = dict(cols)
            for c in dense:
                cols[c] = np.log1p(np.maximum(cols[c], 0.0)).astype(np.float32)
        return cols, rownums

    def _take(self, m: int, lo: int, hi: int) -> dict:
        """Consumes `m` buffered rows and returns rows `[lo, hi)` of them."""
        parts = []
        pos = 0
        left = m
        while left > 0:
            block = self._blocks[0]
            cols, rownums, loc, off = block
            avail = len(rownums) - off
            k = min(avail, left)
            a, z = max(lo - pos, 0), min(hi - pos, k)
            if a < z:
                parts.append(C.slice_columns(cols, off + a, off + z))
            pos += k
            left -= k
            block[3] = off + k
            self._buffered -= k
            self._resume = (loc, int(rownums[off + k - 1]) + 1)
            if block[3] == len(rownums):
                self._blocks.pop(0)
        if not parts:
            return C.empty_like(self._streams)
        return C.concat_columns(parts)

    def _end_sweep(self):
        report = self._errors.report()
        if report["count"]:
            _logger.warning(
                "%s: sweep %d done; %d malformed records skipped so far, e.g. %s",
                type(self).__name__,
                self._sweep,
                report["count"],
                report["examples"][:3],
            )
        self._sweep += 1
        self._position = 0
        self._resume = None
        self._errors.new_sweep()
        self._reset_buffer()
