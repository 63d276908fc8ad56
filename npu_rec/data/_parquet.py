"""`ParquetSource`: Parquet files read one row group at a time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from npu_rec.data import _convert
from npu_rec.data._row_source import RowSource


class ParquetSource(RowSource):
    """A minibatch source over Parquet files, reading row groups lazily.

    Column roles and conversions are those of `CsvSource`: label and dense
    columns (any numeric type, or text holding numbers) become float32 with
    nulls -> `DENSE_FILL`; categorical text is hashed (FarmHash64) and integer
    columns are raw ids, nulls/"" -> `MISSING_ID`; multi-valued columns may be
    lists (of text or integers) or `|`-separated text. Rows are numbered from 0
    within each file; errors name the file and the row.

    Args:
      paths: a file, a glob pattern, or a list of them (read in order).
      label: the label column.
      dense: dense numeric columns.
      categorical: categorical columns.
      multi_valued: multi-valued columns.
      on_error: "raise" or "skip" (see `CsvSource`).
      log_dense: map dense values through `log1p(max(x, 0))`.
      separator: the item separator of text multi-valued columns.
      label_domain: the allowed label values, or None for any finite label (see
        `CsvSource`).

    Example:
      >>> src = ParquetSource("part-*.parquet", label="label", categorical=["C1"])
      >>> mb = src.next_minibatch(1024, number_of_workers=2, worker_rank=1)
    """

    unit = "row"

    def __init__(
        self,
        paths,
        *,
        label: str,
        dense=(),
        categorical=(),
        multi_valued=(),
        on_error: str = "raise",
        log_dense: bool = False,
        separator: str = "|",
        label_domain=None,
    ):
        super().__init__(
            paths,
            label=label,
            dense=dense,
            categorical=categorical,
            multi_valued=multi_valued,
            on_error=on_error,
            label_domain=label_domain,
            log_dense=log_dense,
        )
        self._separator = separator

    def _open(self, loc, min_row):
        first = 0 if loc is None else loc["file"]
        for i in range(first, len(self._files)):
            here = loc if (loc is not None and i == first) else None
            yield from self._read_file(i, here, min_row if here is not None else 0)

    def _read_file(self, i: int, loc, min_row: int):
        path = self._files[i]
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as err:
            self._errors.record(path, "row", 0, f"not a readable Parquet file: {err}")
            return
        try:
            yield from self._read_row_groups(pf, i, loc, min_row)
        finally:
            pf.close()  # only closes the file: safe when a finaliser drops the reader

    def _read_row_groups(self, pf, i: int, loc, min_row: int):
        path = self._files[i]
        names = pf.schema_arrow.names
        missing = [c for c in self._wanted if c not in names]
        if missing:
            raise ValueError(
                f"{path}: column(s) {missing} not found; the file's columns are {names}"
            )
        meta = pf.metadata
        starts = np.concatenate(
            [[0], np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])]
        )
        first_group = 0 if loc is None else loc["row_group"]
        for g in range(first_group, meta.num_row_groups):
            if starts[g + 1] <= min_row:
                continue
            here = {"file": i, "row_group": g}
            try:
                table = pf.read_row_group(g, columns=self._wanted)
            except (pa.ArrowInvalid, OSError) as err:
                self._errors.record(
                    path,
                    "row",
                    int(starts[g]),
                    f"unreadable row group {g} (rows {starts[g]}-{starts[g + 1] - 1}): {err}",
                )
                continue
            rownums = starts[g] + np.arange(table.num_rows, dtype=np.int64)
            yield (*self._convert(path, table, rownums, min_row), here)

    def _convert(self, path, table, rownums, min_row):
        ok = rownums >= min_row
        label = table.column(self.label_name)
        bad = label.is_null().to_numpy(zero_copy_only=False)
        for c in (self.label_name, *self._roles[1]):
            col = table.column(c)
            if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
                bad = bad | self._unparsable(path, c, col, rownums, ok)
        for j in np.flatnonzero(label.is_null().to_numpy(zero_copy_only=False) & ok):
            self._errors.record(path, "row", int(rownums[j]), f"empty label {self.label_name!r}")
        ok &= ~bad
        if not ok.all():
            table = table.filter(pa.array(ok))
            rownums = rownums[ok]
        cols = _convert.convert_table(table, self._roles, separator=self._separator)
        return cols, rownums

    def _unparsable(self, path, name, col, rownums, ok) -> np.ndarray:
        """Marks (and reports) the rows of a text column that do not hold a number."""
        try:
            col.cast(pa.float64())
            return np.zeros(len(col), bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        bad = np.zeros(len(col), bool)
        for j, value in enumerate(col.to_pylist()):
            try:
                pa.array([value]).cast(pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad[j] = True
                if ok[j]:
                    self._errors.record(
                        path,
                        "row",
                        int(rownums[j]),
                        f"unparsable number {value!r} in column {name!r}",
                    )
        return bad
