"""`CsvSource`: CSV/TSV click logs (Criteo, Avazu, MovieLens) read lazily.

Files are read in blocks of about `block_bytes` cut at line ends and parsed by
Arrow's CSV reader, so memory stays bounded whatever the file size. A record
is one line (quoted fields may hold delimiters but not line breaks); blank
lines are ignored. When Arrow rejects a block, its lines are bisected to find
each malformed line, which is reported with its file, 1-based line number and
reason, or skipped and counted with `on_error="skip"`.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from npu_rec.data import _columns as C
from npu_rec.data import _convert
from npu_rec.data._errors import MalformedRecordError
from npu_rec.data._row_source import RowSource

CRITEO_COLUMNS = ("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)))
BLOCK_BYTES = 8 << 20
_BOM = b"\xef\xbb\xbf"
_NULLS = ("", "NA", "N/A", "NaN", "nan", "-nan", "NULL", "null", "#N/A", "n/a", "-NaN", "None")


def _open_data(path: str):
    """The file's bytes: gzip files (recognised by their first bytes) are decompressed.

    Reading positions are offsets into the decompressed bytes; reopening a gzip file
    there decompresses from its start (seeking costs time in proportion to the offset).
    """
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


class _Damaged(Exception):
    """Gzip data that ends early or cannot be decoded, with the bytes decoded before it."""

    def __init__(self, data: bytes, reason: str):
        super().__init__(reason)
        self.data, self.reason = data, reason


def _read(f, size: int) -> bytes:
    """Up to `size` bytes of `f`; from a gzip file, as many as decode before any damage.

    A gzip file is read one compressed chunk at a time (`read1`), so bytes decoded
    before a truncation or a corruption are kept (`_Damaged.data`) instead of
    being lost with the read that meets it.
    """
    if not isinstance(f, gzip.GzipFile):
        return f.read(size)
    parts, got = [], 0
    try:
        while got < size:
            chunk = f.read1(size - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
    except EOFError:
        raise _Damaged(
            b"".join(parts), "compressed stream ends early (truncated gzip file)"
        ) from None
    except (zlib.error, gzip.BadGzipFile) as err:
        raise _Damaged(b"".join(parts), f"corrupted gzip data ({err})") from None
    return b"".join(parts)


def _arrow_or_none(options: dict, data: bytes) -> pa.Table | None:
    """Arrow's parse of a block, or None when Arrow rejects it (run in the parsing thread)."""
    try:
        return pacsv.read_csv(io.BytesIO(data), **options)
    except pa.ArrowInvalid:
        return None


class CsvSource(RowSource):
    """A minibatch source over CSV/TSV files; stream names are column names.

    Streams, in order: the label (float32), `dense` (float32, empty ->
    `DENSE_FILL`), `categorical` (int64 FarmHash64 ids, empty -> `MISSING_ID`),
    `multi_valued` (ragged int64 ids of `|`-separated items).

    Args:
      paths: a file, a glob pattern, or a list of them (read in order).
      label: the label column.
      dense: dense numeric columns.
      categorical: categorical columns.
      multi_valued: multi-valued columns.
      delimiter: the field separator (one character).
      header: whether each file starts with a line of column names.
      on_error: "raise" (a malformed line raises `MalformedRecordError`) or
        "skip" (it is counted, logged and reported by `error_report()`).
      column_names: the file's columns, required when `header=False`.
      log_dense: map dense values through `log1p(max(x, 0))`.
      separator: the item separator of multi-valued columns.
      block_bytes: bytes read and parsed at a time.
      label_domain: the allowed label values, e.g. `(0, 1)` for clicks; None (the
        default) allows any finite label (ratings, regression targets). A label
        outside it is a malformed record, like a non-finite label or dense value.

    Example:
      >>> src = CsvSource("day_*.csv", label="click", categorical=["site_id"], label_domain=(0, 1))
      >>> mb = src.next_minibatch(512)
      >>> mb[src.stream("site_id")].data.dtype
      dtype('int64')
    """

    unit = "line"

    def __init__(
        self,
        paths,
        *,
        label: str,
        dense=(),
        categorical=(),
        multi_valued=(),
        delimiter: str = ",",
        header: bool = True,
        on_error: str = "raise",
        column_names=None,
        log_dense: bool = False,
        separator: str = "|",
        block_bytes: int = BLOCK_BYTES,
        label_domain=None,
    ):
        def check_options():
            if not isinstance(delimiter, str) or len(delimiter) != 1:
                raise ValueError(
                    f"`delimiter` must be a single character. Received: delimiter={delimiter!r}"
                )
            if not header and column_names is None:
                raise ValueError(
                    "`column_names` is required when header=False. Received: column_names=None"
                )

        super().__init__(
            paths,
            label=label,
            dense=dense,
            categorical=categorical,
            multi_valued=multi_valued,
            on_error=on_error,
            label_domain=label_domain,
            log_dense=log_dense,
            check_options=check_options,
        )
        self._delimiter = delimiter
        self._header = bool(header)
        self._column_names = None if column_names is None else tuple(column_names)
        self._separator = separator
        self._block_bytes = int(block_bytes)
        self._numeric = [label, *self._roles[1]]
        self._types = {c: pa.float64() for c in self._numeric}
        self._types.update({c: pa.dictionary(pa.int32(), pa.string()) for c in self._roles[2]})
        self._types.update({c: pa.string() for c in self._roles[3]})
        self._pool = None

    @classmethod
    def criteo(
        cls,
        paths,
        *,
        header: bool = False,
        delimiter: str = "\t",
        on_error: str = "raise",
        label_domain=(0, 1),
        **kwargs,
    ) -> CsvSource:
        """Criteo's click logs: `label` (0 or 1), dense `I1`-`I13`, categorical `C1`-`C26`.

        Args:
          paths: files or glob patterns (e.g. "day_*" of the Criteo 1TB logs).
          header: whether files start with a header line (the shipped sample does).
          delimiter: "\\t" for the original logs, "," for the shipped sample.
          on_error: "raise" or "skip".
          label_domain: the allowed labels: clicks, 0 or 1.
          **kwargs: further `CsvSource` arguments (e.g. `log_dense=True`).
        """
        if not header:
            kwargs.setdefault("column_names", CRITEO_COLUMNS)
        return cls(
            paths,
            label="label",
            dense=CRITEO_COLUMNS[1:14],
            categorical=CRITEO_COLUMNS[14:],
            delimiter=delimiter,
            header=header,
            on_error=on_error,
            label_domain=label_domain,
            **kwargs,
        )

    # -- reading ------------------------------------------------------------

    def _open(self, loc, min_row):
        first = 0 if loc is None else loc["file"]
        for i in range(first, len(self._files)):
            here = loc if (loc is not None and i == first) else None
            yield from self._read_file(i, here, min_row if here is not None else 0)

    def _file_columns(self, path: str, f) -> list[str] | None:
        """The file's column names (its header, or `column_names`); None for an empty file."""
        if f.read(len(_BOM)) != _BOM:  # a UTF-8 byte-order mark (some exporters write one)
            f.seek(0)
        if not self._header:
            names = list(self._column_names)
        else:
            raw = f.readline()
            if not raw.strip(b"\r\n"):
                if not raw and not f.read(1):
                    return None  # an empty file (e.g. an empty part of a partitioned output)
                raise MalformedRecordError(
                    path,
                    "line",
                    1,
                    "the header line is empty (header=True): expected the file's column names",
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise MalformedRecordError(
                    path, "line", 1, f"invalid UTF-8 in the header ({err.reason})"
                ) from None
            names = next(csv.reader([text], delimiter=self._delimiter), []) if text else []
            names = [n.strip() for n in names]
        missing = [c for c in self._wanted if c not in names]
        if missing:
            raise ValueError(
                f"{path}: column(s) {missing} not found; the file's columns are {names}"
            )
        return names

    def _parser(self) -> ThreadPoolExecutor:
        """The source's one parsing thread, started on first use and stopped by `close()`.

        The source owns it, not the reader generator: a generator abandoned mid-read
        is finalised by the garbage collector at any allocation, even inside another
        thread's start-up, so its clean-up must never wait for a thread.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="npu_rec-CsvSource")
        return self._pool

    def _release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _read_file(self, i: int, loc, min_row: int):
        """Yields the file's blocks; Arrow parses block k+1 in a thread while k is converted."""
        path = self._files[i]
        pending = None
        with _open_data(path) as f:
            try:
                names = self._file_columns(path, f)
                if names is None:
                    return
                if loc is None:
                    offset, line = f.tell(), 2 if self._header else 1
                else:
                    offset, line = loc["offset"], loc["line"]
                    f.seek(offset)
                damage = []
                for data, at_eof in self._blocks_of(f, damage):
                    here = {"file": i, "offset": offset, "line": line}
                    # The thread gets Arrow's options, not the source: a queued block never
                    # keeps an abandoned source (and so its thread) alive.
                    parsed = self._parser().submit(_arrow_or_none, self._options(names), data)
                    job = (here, data, at_eof, parsed)
                    if pending is not None:
                        yield self._finish(path, names, min_row, *pending)
                    pending = job
                    offset += len(data)
                    line += data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
                if pending is not None:
                    job, pending = pending, None
                    yield self._finish(path, names, min_row, *job)
                if damage and line >= min_row:
                    if line > (2 if self._header else 1):
                        where = f"after line {line - 1}, the last complete line"
                    else:
                        where = "before the first complete line"
                    self._errors.record(path, "line", line, f"{damage[0]} {where}")
            finally:
                if pending is not None:
                    pending[-1].cancel()  # never waits: a block being parsed just finishes

    def _blocks_of(self, f, damage: list):
        """`(data, at_eof)`: about `block_bytes` of whole lines at a time.

        Damaged gzip data ends the file early: every whole line decoded before
        it is yielded and the error is appended to `damage`.
        """
        rest = b""
        while True:
            try:
                buf = _read(f, self._block_bytes)
            except _Damaged as err:
                damage.append(err.reason)
                data = rest + err.data
                cut = data.rfind(b"\n") + 1
                if cut:
                    yield data[:cut], False
                return
            data = rest + buf
            if not data:
                return
            if buf:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    rest = data
                    continue
                data, rest = data[:cut], data[cut:]
            else:
                rest = b""
            yield data, not buf

    def _finish(self, path, names, min_row, here, data, at_eof, parsed):
        cols, rownums = self._parse(
            path, names, data, here["line"], min_row, at_eof, parsed.result()
        )
        return cols, rownums, here

    def _options(self, names) -> dict:
        """Arrow's CSV options for a file with columns `names`."""
        return dict(
            read_options=pacsv.ReadOptions(column_names=names),
            parse_options=pacsv.ParseOptions(delimiter=self._delimiter),
            convert_options=pacsv.ConvertOptions(
                column_types=self._types,
                include_columns=self._wanted,
                strings_can_be_null=False,
            ),
        )

    def _arrow(self, names, data: bytes) -> pa.Table:
        return pacsv.read_csv(io.BytesIO(data), **self._options(names))

    def _parse(self, path, names, data, first_line, min_row, at_eof, table):
        """Converts a block that Arrow parsed (`table`), or finds its bad lines (`table=None`)."""
        n_lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        if table is not None and table.num_rows == n_lines:
            rownums = first_line + np.arange(n_lines, dtype=np.int64)
        else:
            lines = data.split(b"\n")
            if lines[-1] == b"":
                lines.pop()
            keep = [j for j, ln in enumerate(lines) if ln.strip(b"\r")]
            if table is None:
                bad = self._bisect(names, lines, keep, 0, len(keep))
                for j in bad:
                    if first_line + j >= min_row:
                        reason = self._diagnose(names, lines[j], at_eof and j == len(lines) - 1)
                        self._errors.record(path, "line", first_line + j, reason)
                bad_set = set(bad)
                keep = [j for j in keep if j not in bad_set]
                if not keep:
                    return C.empty_like(self._streams), np.zeros([0], np.int64)
                table = self._arrow(names, b"".join(lines[j] + b"\n" for j in keep))
            rownums = first_line + np.asarray(keep, dtype=np.int64)
        ok = rownums >= min_row
        empty_label = table.column(self.label_name).is_null().to_numpy(zero_copy_only=False)
        for j in np.flatnonzero(empty_label & ok):
            self._errors.record(path, "line", int(rownums[j]), f"empty label {self.label_name!r}")
        ok &= ~empty_label
        cols = _convert.convert_table(table, self._roles, separator=self._separator)
        if not ok.all():
            cols, rownums = C.take_rows(cols, ok), rownums[ok]
        return cols, rownums

    def _bisect(self, names, lines, idx, lo, hi) -> list[int]:
        """Indices (into `lines`) of the lines among `idx[lo:hi]` that Arrow rejects, in order."""
        if lo >= hi:
            return []
        try:
            self._arrow(names, b"".join(lines[j] + b"\n" for j in idx[lo:hi]))
            return []
        except pa.ArrowInvalid:
            if hi - lo == 1:
                return [idx[lo]]
        mid = (lo + hi) // 2
        return self._bisect(names, lines, idx, lo, mid) + self._bisect(names, lines, idx, mid, hi)

    def _diagnose(self, names, raw: bytes, last_line: bool) -> str:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"invalid UTF-8 at byte {err.start} of the line ({err.reason})"
        fields = next(csv.reader([text.rstrip("\r")], delimiter=self._delimiter), [])
        if len(fields) != len(names):
            msg = f"wrong number of fields: expected {len(names)}, found {len(fields)}"
            if last_line:
                msg += " (the file ends inside this line: truncated file?)"
            return msg
        for c in self._numeric:
            value = fields[names.index(c)]
            if value.strip() in _NULLS:
                continue
            try:
                pa.array([value]).cast(pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return f"unparsable number {value!r} in column {c!r}"
        try:
            self._arrow(names, raw + b"\n")
        except pa.ArrowInvalid as err:
            return f"rejected by the CSV parser: {err}"
        return "rejected by the CSV parser"
