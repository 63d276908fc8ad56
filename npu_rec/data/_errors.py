"""Malformed records: the error raised, and the log kept with `on_error="skip"`."""

from __future__ import annotations

import logging

_logger = logging.getLogger("npu_rec.data")

MAX_EXAMPLES = 5


class MalformedRecordError(ValueError):
    """A record that cannot be read: names the file, the line/record and the reason.

    Attributes:
      path: the file.
      unit: "line" (text files), "record" (TFRecord) or "row" (Parquet).
      row: the 1-based line number, or the 0-based record/row index.
      reason: what is wrong.
    """

    def __init__(self, path: str, unit: str, row: int, reason: str):
        self.path, self.unit, self.row, self.reason = path, unit, row, reason
        super().__init__(f"{path}, {unit} {row}: {reason}")


class ErrorLog:
    """Counts malformed records, keeps the first few, and raises or skips.

    Records are counted during the first sweep only (later sweeps meet the same
    records again); the count and examples travel with the checkpoint state,
    which leaves out records met while reading ahead of the saved position (a
    restored source meets them again).
    """

    def __init__(self, on_error: str):
        self.on_error = on_error
        self.count = 0
        self.examples: list[dict] = []
        self.sweep = 0
        self._keys: list[tuple] = []  # (path, row) of each record counted in this sweep

    def record(self, path: str, unit: str, row: int, reason: str) -> None:
        """Raises `MalformedRecordError` or (with on_error="skip") logs and counts it."""
        if self.on_error == "raise":
            raise MalformedRecordError(path, unit, row, reason)
        if self.sweep > 0:
            return
        self.count += 1
        self._keys.append((path, int(row)))
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"file": path, unit: int(row), "reason": reason})
            _logger.warning("Skipping malformed record: %s, %s %d: %s", path, unit, row, reason)

    def new_sweep(self) -> None:
        self.sweep += 1
        self._keys = []

    def report(self) -> dict:
        return {"count": self.count, "examples": [dict(e) for e in self.examples]}

    def get_state(self, is_ahead=lambda path, row: False) -> dict:
        """The log without the records for which `is_ahead(path, row)` is True."""
        ahead = {k for k in self._keys if is_ahead(*k)}
        examples = [e for e in self.examples if (e["file"], _row(e)) not in ahead]
        return {"count": self.count - len(ahead), "examples": examples, "sweep": self.sweep}

    def set_state(self, state: dict) -> None:
        self.count = int(state["count"])
        self.examples = [dict(e) for e in state["examples"]]
        self.sweep = int(state["sweep"])
        self._keys = [(e["file"], _row(e)) for e in self.examples]


def _row(example: dict) -> int:
    return next(v for k, v in example.items() if k not in ("file", "reason"))
