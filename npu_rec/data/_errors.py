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
      row_in_record: for a record holding several rows (a Kafka message of
        several lines), the 0-based row within it; else None.
    """

    def __init__(self, path: str, unit: str, row: int, reason: str, row_in_record=None):
        self.path, self.unit, self.row, self.reason = path, unit, row, reason
        self.row_in_record = row_in_record
        within = "" if row_in_record is None else f", row {row_in_record}"
        super().__init__(f"{path}, {unit} {row}{within}: {reason}")


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
        # (path, row[, row_in_record]) of each record counted in this sweep
        self._keys: list[tuple] = []

    def record(self, path: str, unit: str, row: int, reason: str, row_in_record=None) -> None:
        """Raises `MalformedRecordError` or (with on_error="skip") logs and counts it.

        `row_in_record`: the row within a record holding several (None: the record).
        """
        if self.on_error == "raise":
            raise MalformedRecordError(path, unit, row, reason, row_in_record)
        if self.sweep > 0:
            return
        self.count += 1
        within = () if row_in_record is None else (int(row_in_record),)
        self._keys.append((path, int(row), *within))
        if len(self.examples) < MAX_EXAMPLES:
            example = {"file": path, unit: int(row)}
            if within:
                example["row_in_record"] = within[0]
            self.examples.append({**example, "reason": reason})
            _logger.warning(
                "Skipping malformed record: %s, %s %d%s: %s",
                path,
                unit,
                row,
                f", row {within[0]}" if within else "",
                reason,
            )

    def new_sweep(self) -> None:
        self.sweep += 1
        self._keys = []

    def report(self) -> dict:
        return {"count": self.count, "examples": [dict(e) for e in self.examples]}

    def get_state(self, is_ahead=lambda path, row, *within: False) -> dict:
        """The log without the records for which `is_ahead(path, row[, row_in_record])`."""
        ahead = {k for k in self._keys if is_ahead(*k)}
        examples = [e for e in self.examples if _key(e) not in ahead]
        return {"count": self.count - len(ahead), "examples": examples, "sweep": self.sweep}

    def set_state(self, state: dict) -> None:
        self.count = int(state["count"])
        self.examples = [dict(e) for e in state["examples"]]
        self.sweep = int(state["sweep"])
        self._keys = [_key(e) for e in self.examples]


def _row(example: dict) -> int:
    return next(v for k, v in example.items() if k not in ("file", "reason", "row_in_record"))


def _key(example: dict) -> tuple:
    within = example.get("row_in_record")
    return (example["file"], _row(example), *(() if within is None else (within,)))
