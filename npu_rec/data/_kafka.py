"""`KafkaSource`: click logs read from a Kafka topic, with offsets kept in the checkpoint.

A message holds one or more rows: delimited lines in `columns` order, separated
by line breaks (`format="csv"`, a block of messages parsed at once by the same
code as `CsvSource`), a JSON object or several JSON lines (`format="json"`), or
one serialized `tf.train.Example` (`format="tf_example"`, parsed by the same
code as `TFRecordSource`).
Values are converted and checked by the file sources' rules (hashing, fills,
non-finite values, `label_domain`); a malformed row raises
`MalformedRecordError` naming the topic, partition and offset (and the row
within a message of several rows), or is skipped and counted with
`on_error="skip"`.

Reading position, per partition this source reads: the offset of the first
message not wholly handed to training and the rows of it already handed over
(0 but where a minibatch ended inside a message). It is the source's checkpoint
state, so a trainer that saves it with each checkpoint and restores it resumes
at the first row its restored model has not trained on: nothing lost, nothing
repeated. Partitions are assigned
explicitly (no consumer-group rebalancing decides what a restarted trainer
reads); the broker learns the offsets only through `checkpoint_committed`,
which the front ends call once a checkpoint holding them is committed, so
monitoring tools see the consumer lag and the broker never runs ahead of the
checkpoints.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time

import numpy as np
import pyarrow as pa

from npu_rec.data import _columns as C
from npu_rec.data import _convert
from npu_rec.data._csv import CsvSource, _arrow_or_none
from npu_rec.data._errors import ErrorLog
from npu_rec.data._row_source import RowSource, check_label_domain
from npu_rec.data._source import (
    STATE_VERSION,
    MinibatchData,
    MinibatchSource,
    StreamInformation,
    check_int,
    check_sharding,
)
from npu_rec.data._tfrecord import TFRecordSource

_logger = logging.getLogger("npu_rec.data")

PAUSE_LOG_SECONDS = 60.0  # a quiet stream is logged at most this often
_METADATA_SECONDS = 30.0  # how long to wait for the topic's partitions
BLOCK_MESSAGES = 65536  # messages parsed at once, at most
BLOCK_BYTES = 16 << 20  # about this many bytes of messages parsed at once, at most
CHUNK_BYTES = 4 << 20  # a block's CSV is parsed in chunks of about this size, one ahead
WAIT_SLICE = 0.05  # seconds: the longest single wait for messages within max_wait_ms


def _kafka():
    try:
        import confluent_kafka
    except ImportError:
        raise ImportError(
            "KafkaSource needs confluent-kafka: pip install 'npu-rec[kafka]'"
        ) from None
    return confluent_kafka


class _Units:
    """The rows of a block of messages before parsing (per row: its message's partition
    and offset, its index in the message, whether the message holds several rows and
    whether it is the message's last row)."""

    def __init__(self, parts, offsets, within, several, last):
        self.parts, self.offsets, self.within = parts, offsets, within
        self.several, self.last = several, last

    @classmethod
    def one_each(cls, parts, offsets):
        n = len(parts)
        return cls(parts, offsets, np.zeros(n, np.int64), np.zeros(n, bool), np.ones(n, bool))

    def __getitem__(self, idx):
        return _Units(*(a[idx] for a in vars(self).values()))


_UNIT_TYPES = (np.int64, np.int64, np.int64, bool, bool)


class _MessageErrors:
    """The error log as the shared parsing code sees it: a row is an index into the
    current block's rows (`units`), recorded as its topic, partition, offset and, in a
    message of several rows, its row within the message."""

    def __init__(self, log: ErrorLog, topic: str):
        self.log, self.topic = log, topic
        self.units = None  # the current block's rows
        self.pending = []

    def where(self, p: int) -> str:
        return f"topic {self.topic!r} partition {p}"

    def record(self, path, unit, row, reason) -> None:
        # Kept until the block is parsed, then logged in position order (`flush`), so the
        # first malformed row raises whichever check found it.
        u = self.units
        k = int(u.within[row]) if u.several[row] else -1
        self.pending.append((int(u.parts[row]), int(u.offsets[row]), k, reason))

    def flush(self, skip: dict) -> None:
        """Logs the block's malformed rows but those a restore passes (`skip`)."""
        pending, self.pending = sorted(self.pending, key=lambda e: e[:3]), []
        for p, off, k, reason in pending:
            if p in skip and off == skip[p][0] and k < skip[p][1]:
                continue  # handed to training (or passed) before the restored save
            self.log.record(self.where(p), "offset", off, reason, None if k < 0 else k)

    def __getattr__(self, name):  # count, report, get_state, ...
        return getattr(self.log, name)


class KafkaSource(MinibatchSource):
    """A minibatch source reading a Kafka topic; stream names are column names.

    Streams, in order: the label (float32), `dense` (float32, empty or null ->
    `DENSE_FILL`), `categorical` (int64 FarmHash64 ids of the text, empty or
    null -> `MISSING_ID`), `multi_valued` (ragged int64 ids). The same record
    gives the same ids as `CsvSource`, in either format.

    The stream never ends (`sweep_end` is always False) unless `stop_at_end`:
    `as_dataset(..., num_sweeps=None)`, `online_train` and
    `NPUEstimator.train(max_steps=...)` read it like any source. A call to
    `next_minibatch` returns exactly `num_samples` rows, or, when fewer arrived
    within `max_wait_ms`, an empty minibatch (the rows read so far stay
    buffered for the next call; the pause is logged): a quiet stream never
    blocks a trainer longer than that, and no partial batch is dropped.

    Workers: with `number_of_workers=W`, worker `r` reads the partitions at
    positions `r, r + W, ...` of the sorted partition list, so workers read
    disjoint partitions and each returns `num_samples` rows of its own.

    Args:
      topic: the topic.
      bootstrap_servers: "host:port[,host:port...]" of the cluster.
      columns: the fields of a CSV row, in order (required for "csv";
        JSON messages and Examples name their fields).
      label: the label column.
      dense: dense numeric columns.
      categorical: categorical columns (JSON: strings or integers, hashed as
        their text like CSV fields).
      multi_valued: multi-valued columns (`a|b` text; JSON also lists).
      format: "csv" (a message holds one or more delimited lines, separated by
        line breaks), "json" (one object, or several JSON lines) or "tf_example"
        (one serialized `tf.train.Example`; features as in `TFRecordSource`,
        their kinds read from the first message).
      delimiter: the CSV field separator (one character).
      separator: the item separator of multi-valued text.
      partitions: the partitions to read (default all of the topic's).
      start: where a partition without a saved offset starts: "earliest",
        "latest" (its end when first read), "committed" (the group's offset
        on the broker, else earliest) or a dict `{partition: offset}`
        (partitions it leaves out start at the earliest).
      max_wait_ms: the longest a `next_minibatch` call waits for messages.
      on_error: "raise" or "skip" malformed messages.
      label_domain: the allowed label values (see `CsvSource`).
      log_dense: map dense values through `log1p(max(x, 0))`.
      group_id: the consumer group whose offsets `checkpoint_committed` stores
        on the broker (default "npu_rec-<topic>").
      stop_at_end: end a sweep when every partition read has no more messages
        (for evaluation, benchmarks and tests); default False (endless).
      consumer_config: further librdkafka settings (security, client.id, ...).

    Example:
      >>> src = KafkaSource("clicks", bootstrap_servers="broker:9092",
      ...                   columns=["click", "site"], label="click", categorical=["site"])
      >>> ds = as_dataset(src, 512, num_sweeps=None)
    """

    unit = "offset"

    # The shared rules: CSV parsing and bad-line diagnosis from `CsvSource`, the value
    # checks (non-finite values, label_domain, log_dense) from the file sources.
    _options = CsvSource._options
    _arrow = CsvSource._arrow
    _parse_csv = CsvSource._parse
    _bisect = CsvSource._bisect
    _diagnose = CsvSource._diagnose
    _parser = CsvSource._parser  # the parsing thread: Arrow reads chunk k+1 while k converts
    _release = CsvSource._release
    _check_values = RowSource._check_values
    _file_index = RowSource._file_index
    # `tf.train.Example` messages: the parsing and value-count rules of `TFRecordSource`.
    _detect_kinds = TFRecordSource._detect_kinds
    _spec = TFRecordSource._spec
    _converter = TFRecordSource._converter
    _convert_batch = TFRecordSource._convert_batch
    _parse_slowly = TFRecordSource._parse_slowly
    _to_columns = TFRecordSource._to_columns

    def __init__(
        self,
        topic: str,
        *,
        bootstrap_servers: str,
        columns=None,
        label: str,
        dense=(),
        categorical=(),
        multi_valued=(),
        format: str = "csv",
        delimiter: str = ",",
        separator: str = "|",
        partitions=None,
        start="earliest",
        max_wait_ms: int = 1000,
        on_error: str = "raise",
        label_domain=None,
        log_dense: bool = False,
        group_id: str | None = None,
        stop_at_end: bool = False,
        consumer_config: dict | None = None,
    ):
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"`topic` must be a non-empty string. Received: topic={topic!r}")
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers:
            raise ValueError(
                "`bootstrap_servers` must be 'host:port[,host:port...]'. "
                f"Received: bootstrap_servers={bootstrap_servers!r}"
            )
        if format not in ("csv", "json", "tf_example"):
            raise ValueError(
                f"`format` must be 'csv', 'json' or 'tf_example'. Received: format={format!r}"
            )
        if on_error not in ("raise", "skip"):
            raise ValueError(
                f"`on_error` must be 'raise' or 'skip'. Received: on_error={on_error!r}"
            )
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(
                f"`delimiter` must be a single character. Received: delimiter={delimiter!r}"
            )
        self._roles = _convert.check_columns(label, dense, categorical, multi_valued)
        self.label_name = label
        self._wanted = [label, *self._roles[1], *self._roles[2], *self._roles[3]]
        if format == "csv":
            if columns is None or isinstance(columns, str) or not len(columns):
                raise ValueError(
                    "`columns` must list the fields of a CSV message, in order. "
                    f"Received: columns={columns!r}"
                )
            missing = [c for c in self._wanted if c not in columns]
            if missing:
                raise ValueError(
                    f"`columns` must include every column read; {missing} are missing. "
                    f"Received: columns={list(columns)!r}"
                )
        self._names = None if columns is None else [str(c) for c in columns]
        if partitions is not None:
            partitions = sorted({check_int("partitions", p, 0) for p in partitions})
            if not partitions:
                raise ValueError(
                    "`partitions` must be None or name at least one partition. "
                    f"Received: partitions={partitions!r}"
                )
        self._partitions = partitions
        self._start = self._check_start(start)
        self._max_wait = check_int("max_wait_ms", max_wait_ms, 0) / 1000.0
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id or f"npu_rec-{topic}"
        self._format = format
        self._delimiter = delimiter
        self._separator = separator
        self._stop_at_end = bool(stop_at_end)
        self._extra_config = dict(consumer_config or {})
        self.label_domain = check_label_domain(label_domain)
        self._log_dense = bool(log_dense)
        self._on_error = on_error
        self._streams = _convert.column_streams(*self._roles)
        self._numeric = [label, *self._roles[1]]
        self._types = {c: pa.float64() for c in self._numeric}
        self._types.update({c: pa.dictionary(pa.int32(), pa.string()) for c in self._roles[2]})
        self._types.update({c: pa.string() for c in self._roles[3]})
        self._pool = None  # the parsing thread (started on first use, stopped by close())
        self._kinds = None  # tf_example: the feature kinds, read from the first message
        self._files = [topic]  # where the shared value checks name a record (see _MessageErrors)
        self._errors = _MessageErrors(ErrorLog(on_error), topic)
        # partition -> the first message not wholly consumed, and its rows consumed
        self._offsets: dict[int, int] = {}
        self._rows: dict[int, int] = {}  # (only partitions inside a message)
        self._skip: dict[int, tuple] = {}  # partition -> (offset, rows) to pass when fetched
        self._message_bytes = 256.0  # the mean size of the messages of the last block
        self._message_rows = 1.0  # the mean rows per message of the last block
        self._shard = None  # (number_of_workers, worker_rank) of the assignment
        self._assigned: list[int] = []
        self._consumer = None
        self._lock = threading.Lock()  # the consumer: reading thread vs checkpoint_committed
        self._call = threading.Lock()  # held by a next_minibatch call
        self._reading = False  # a thread is in consume()
        self._pending_commit = None  # offsets to commit once no consume() runs
        self._sweep = 0
        self._last_pause_log = -math.inf
        self._reset_buffer()

    @staticmethod
    def _check_start(start):
        if start in ("earliest", "latest", "committed"):
            return start
        if isinstance(start, dict):
            out = {}
            for p, off in start.items():
                out[check_int("start partition", p, 0)] = check_int("start offset", off, 0)
            return out
        raise ValueError(
            "`start` must be 'earliest', 'latest', 'committed' or a dict {partition: offset}. "
            f"Received: start={start!r}"
        )

    # -- the contract -----------------------------------------------------

    def stream_infos(self) -> list[StreamInformation]:
        return list(self._streams)

    def next_minibatch(self, num_samples, number_of_workers=1, worker_rank=0):
        b, w, r = check_sharding(num_samples, number_of_workers, worker_rank)
        with self._call:  # `close()` from another thread waits for this call
            return self._next(b, w, r)

    def _next(self, b: int, w: int, r: int):
        self._assign(w, r)
        deadline = time.monotonic() + self._max_wait
        while self._buffered < b and not self._at_end():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # In slices: the client waits for as many messages as asked; a stream's end
            # (stop_at_end) or a pending commit is seen between slices.
            self._fetch(b - self._buffered, min(left, WAIT_SLICE))
        if self._buffered >= b:
            return self._minibatch(self._take(b), False)
        if self._at_end():
            self._sweep += 1
            return self._minibatch(self._take(self._buffered), True)
        now = time.monotonic()
        if now - self._last_pause_log >= PAUSE_LOG_SECONDS:
            self._last_pause_log = now
            _logger.info(
                "KafkaSource: topic %r gave %d of %d rows within max_wait_ms=%d; pausing "
                "(the rows stay buffered for the next batch)",
                self.topic,
                self._buffered,
                b,
                int(self._max_wait * 1000),
            )
        return self._minibatch(C.empty_like(self._streams), False)

    def get_checkpoint_state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "source": type(self).__name__,
            "topic": self.topic,
            "offsets": {str(p): int(off) for p, off in sorted(self._offsets.items())},
            "rows": {str(p): int(k) for p, k in sorted(self._rows.items()) if k},
            "errors": self._errors.get_state(self._is_ahead),
        }

    def restore_from_checkpoint(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"`state` must be a dict from get_checkpoint_state() (version {STATE_VERSION}). "
                f"Received: state={state!r}"
            )
        if state.get("source") != type(self).__name__ or state.get("topic") != self.topic:
            raise ValueError(
                "`state` was saved by a different source: saved "
                f"{state.get('source')} over topic {state.get('topic')!r}, restoring into "
                f"{type(self).__name__} over topic {self.topic!r}"
            )
        self._offsets = {int(p): int(off) for p, off in state["offsets"].items()}
        # A state saved before positions inside a message existed has no "rows".
        self._rows = {int(p): int(k) for p, k in (state.get("rows") or {}).items() if int(k)}
        self._errors.set_state(state["errors"])
        self._reset_buffer()
        if self._shard is not None:
            self._seek_assigned()

    def checkpoint_committed(self, state: dict | None) -> None:
        """Stores the offsets of a committed checkpoint's `state` on the broker.

        Per partition, the offset of the first message the checkpoint has not wholly
        trained on (a message it trained partly on is read again from the broker's
        offset, and its trained rows passed, only by a restore from the checkpoint).

        The front ends call it once the checkpoint that holds `state` is committed
        (never earlier), so the group's offsets on the broker trail the checkpoints
        and show the consumer lag. Reading never starts from them unless
        `start="committed"`. It never waits: the commit is asynchronous, and sent by
        the reading thread when that thread is in `consume()` (`close()` sends what is
        left and waits for it). A failure is logged, never raised.
        """
        if not state or state.get("topic") != self.topic or not state.get("offsets"):
            return
        ck = _kafka()
        offsets = [
            ck.TopicPartition(self.topic, int(p), int(o)) for p, o in state["offsets"].items()
        ]
        with self._lock:
            self._pending_commit = offsets
            # A commit made while another thread waits in consume() can wait as long as
            # that thread keeps consuming (a quiet stream): the reading thread commits it
            # when its consume() returns.
            if not self._reading:
                self._commit_pending()

    def _commit_pending(self) -> None:
        """Sends the offsets `checkpoint_committed` left (asynchronously); lock held."""
        offsets, self._pending_commit = self._pending_commit, None
        if not offsets:
            return
        try:
            self._get_consumer().commit(offsets=offsets, asynchronous=True)
        except Exception as err:  # monitoring only: training goes on
            _logger.warning(
                "KafkaSource: could not commit offsets of topic %r: %s", self.topic, err
            )

    def _on_commit(self, err, partitions) -> None:
        if err is not None:
            _logger.warning(
                "KafkaSource: committing offsets of topic %r failed: %s", self.topic, err
            )

    def close(self) -> None:
        """Closes the consumer; the position (consumed offsets) is kept."""
        # A `next_minibatch` running in another thread (a dataset's read-ahead) is let
        # finish: it returns within `max_wait_ms` plus the parsing of one block.
        called = self._call.acquire(timeout=self._max_wait + 60)
        try:
            with self._lock:
                if self._consumer is not None:
                    self._commit_pending()
                consumer, self._consumer = self._consumer, None
            self._shard = None
            self._reset_buffer()
        finally:
            if called:
                self._call.release()
        self._release()
        if consumer is not None:
            consumer.poll(0)  # serves pending commit callbacks
            consumer.close()  # waits for the commits in flight

    def error_report(self) -> dict:
        """Skipped malformed messages so far (with `on_error="skip"`).

        Returns:
          `{"count": int, "examples": [{"file", "offset", "reason"}, ...]}`: `file`
          names the topic and partition.
        """
        return self._errors.report()

    @property
    def assigned_partitions(self) -> list[int]:
        """The partitions this source reads (known after the first `next_minibatch`)."""
        return list(self._assigned)

    # -- the consumer -------------------------------------------------------

    def _config(self) -> dict:
        return {
            **self._extra_config,
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "on_commit": self._on_commit,
        }

    def _get_consumer(self):
        if self._consumer is None:
            self._consumer = _kafka().Consumer(self._config())
        return self._consumer

    def _topic_partitions(self, consumer) -> list[int]:
        deadline = time.monotonic() + _METADATA_SECONDS
        while True:
            md = consumer.list_topics(self.topic, timeout=_METADATA_SECONDS).topics.get(self.topic)
            if md is not None and md.error is None and md.partitions:
                return sorted(md.partitions)
            if time.monotonic() > deadline:
                raise ValueError(
                    f"`topic` must name a topic of the cluster at {self.bootstrap_servers}. "
                    f"Received: topic={self.topic!r} ({md.error if md is not None else 'absent'})"
                )
            time.sleep(0.2)

    def _assign(self, w: int, r: int) -> None:
        if self._shard == (w, r):
            return
        with self._lock:
            consumer = self._get_consumer()
        every = self._partitions or self._topic_partitions(consumer)
        mine = every[r::w]
        if not mine:
            raise ValueError(
                f"`number_of_workers` must be <= the number of partitions read ({len(every)}): "
                f"worker {r} of {w} would read none of topic {self.topic!r}'s partitions {every}"
            )
        self._shard, self._assigned = (w, r), mine
        self._reset_buffer()
        self._seek_assigned()

    def _start_offset(self, consumer, p: int) -> int:
        ck = _kafka()
        tp = ck.TopicPartition(self.topic, p)
        low, high = consumer.get_watermark_offsets(tp, timeout=_METADATA_SECONDS)
        start = self._start
        if isinstance(start, dict):
            return max(start.get(p, low), low)
        if start == "latest":
            return high
        if start == "committed":
            got = consumer.committed([tp], timeout=_METADATA_SECONDS)[0].offset
            return got if got >= 0 else low
        return low

    def _seek_assigned(self) -> None:
        """Assigns this source's partitions at their reading positions (explicitly)."""
        ck = _kafka()
        with self._lock:
            consumer = self._get_consumer()
            for p in self._assigned:
                if p not in self._offsets:
                    self._offsets[p] = self._start_offset(consumer, p)
            self._skip = {
                p: (self._offsets[p], self._rows[p]) for p in self._assigned if self._rows.get(p)
            }
            consumer.assign(
                [ck.TopicPartition(self.topic, p, self._offsets[p]) for p in self._assigned]
            )

    def _at_end(self) -> bool:
        """With `stop_at_end`: every partition read has been fetched up to the end it reported.

        librdkafka reports a partition's end when its fetcher gets there, possibly before
        the application has taken the messages queued up to it, so the reported end
        offset is compared with what was fetched.
        """
        if not self._stop_at_end:
            return False
        for p in self._assigned:
            end = self._eof.get(p)
            if end is None or self._fetched.get(p, self._offsets.get(p, 0)) < end:
                return False
        return True

    def _fetch(self, want: int, timeout: float) -> None:
        ck = _kafka()
        with self._lock:
            consumer = self._get_consumer()
            self._reading = True
        # At most BLOCK_MESSAGES messages, or about BLOCK_BYTES (by the last block's sizes).
        most = int(min(BLOCK_MESSAGES, max(BLOCK_BYTES // max(self._message_bytes, 1.0), 1)))
        try:
            n = min(max(math.ceil(want / self._message_rows), 1), most)
            # What the client has already fetched first, without waiting: the client
            # waits for all `n` messages (or the timeout), even when an end of partition
            # (`stop_at_end`) comes before them.
            messages = consumer.consume(n, 0) or consumer.consume(n, timeout)
            if messages:  # the block's byte bound, by the sizes of its first messages
                size = max(len(m) for m in messages[:8])
                most = max(min(most, BLOCK_BYTES // max(size, 1)), n)
            # More may already wait in the client's queue: take them without waiting, so
            # a busy topic is parsed in large blocks (a block's fixed costs amortised).
            while len(messages) >= n and len(messages) < most:
                more = consumer.consume(most - len(messages), 0)
                if not more:
                    break
                messages += more
        finally:
            with self._lock:
                self._reading = False
                self._commit_pending()
        if not messages:
            return
        # One pass per attribute (the client hands over one object per message).
        errors = [m.error() for m in messages]
        if any(e is not None for e in errors):  # (KafkaError's == fails on None)
            good = []
            for m, err in zip(messages, errors, strict=True):
                if err is None:
                    good.append(m)
                elif err.code() == ck.KafkaError._PARTITION_EOF:
                    self._eof[m.partition()] = m.offset()
                elif err.fatal() or not err.retriable():
                    raise RuntimeError(f"KafkaSource: reading topic {self.topic!r} failed: {err}")
                else:
                    _logger.warning("KafkaSource: topic %r: %s (retrying)", self.topic, err)
            messages = good
        if messages:
            parts = np.array([m.partition() for m in messages], np.int64)
            offs = np.array([m.offset() for m in messages], np.int64)
            self._add_block(parts, offs, [m.value() for m in messages])

    # -- parsing ------------------------------------------------------------

    def _add_block(self, parts: np.ndarray, offs: np.ndarray, values: list) -> None:
        # per partition: the offset after its last message
        ends = dict(zip(parts.tolist(), (offs + 1).tolist(), strict=True))
        self._fetched.update(ends)
        if self._format == "csv":
            cols, rows = self._parse_csv_messages(parts, offs, values)
        elif self._format == "json":
            cols, rows = self._parse_json_messages(parts, offs, values)
        else:
            self._errors.units = _Units.one_each(parts, offs)
            cols, rows = self._parse_example_messages(values)
        cols, rows = self._check_values(None, cols, rows)
        units, self._errors.units = self._errors.units[rows], None
        skip = self._skip
        if skip:  # the rows of a partly trained message that a restored save handed over
            keep = np.ones(len(rows), bool)
            for p, (off, k) in skip.items():
                keep &= ~((units.parts == p) & (units.offsets == off) & (units.within < k))
            if not keep.all():
                cols, units = C.take_rows(cols, keep), units[keep]
        try:
            self._errors.flush(skip)
        except Exception:
            self._shard = None  # the consumer read past this block: reassign on the next call
            raise
        self._skip = {p: sk for p, sk in skip.items() if ends.get(p, 0) <= sk[0]}
        self._message_bytes = max(sum(map(len, filter(None, values))) / len(values), 1.0)
        if len(units.parts):
            self._message_rows = max(len(units.parts) / len(values), 1.0)
        self._blocks.append([cols, units, 0, ends])
        self._buffered += len(units.parts)
        if len(self._blocks) == 1:
            self._pop_done()  # a first block of malformed messages only

    def _parse_csv_messages(self, parts, offs, values):
        """Parses the CSV lines of a block of messages in one go: (columns, row indices)."""
        if None in values:  # a null message: malformed, parsed as a blank line
            nulls = [j for j, v in enumerate(values) if v is None]
            values = [b"" if v is None else v for v in values]
        else:
            nulls = []
        data = b"\n".join(values) + b"\n"
        buf = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(buf == 10)  # each line's line break
        if len(ends) == len(values):  # one line per message
            units, first = _Units.one_each(parts, offs), np.arange(len(values))
        else:
            units, first = self._lines_of(parts, offs, values, ends)
        self._errors.units = units
        for j in nulls:
            self._errors.record(None, None, int(first[j]), "empty message (null value)")
        # Blank lines (a message's trailing line break, "\r" alone) are left out before
        # parsing, so the block takes the parser's fast path.
        starts = np.concatenate([[0], ends[:-1] + 1])
        length = ends - starts
        blank = (length == 0) | ((length == 1) & (buf[np.maximum(ends - 1, 0)] == 13))
        idx = np.arange(len(ends))
        if blank.any():
            idx = idx[~blank]
            if not len(idx):
                return C.empty_like(self._streams), idx
            keep = np.ones(len(buf), bool)
            keep[ends[blank]] = False
            keep[starts[blank & (length == 1)]] = False
            buf = buf[keep]
            data = buf.tobytes()
            ends = np.flatnonzero(buf == 10)
        # Chunks of whole lines, parsed by Arrow in the parsing thread one ahead of the
        # conversion (hashing) of the one before, as `CsvSource` parses a file's blocks.
        cuts = np.searchsorted(ends, np.arange(CHUNK_BYTES, len(data), CHUNK_BYTES))
        bounds = [0, *np.unique(cuts[(cuts > 0) & (cuts < len(ends))]).tolist(), len(ends)]
        options = self._options(self._names)
        jobs = []
        for a, z in zip(bounds[:-1], bounds[1:], strict=True):
            lo, hi = (ends[a - 1] + 1 if a else 0), ends[z - 1] + 1
            chunk = data[lo:hi]
            jobs.append((chunk, idx[a:z], self._parser().submit(_arrow_or_none, options, chunk)))
        parts, rows = [], []
        try:
            for chunk, chunk_idx, parsed in jobs:
                cols, r = self._parse_csv_block(chunk, chunk_idx, parsed.result())
                parts.append(cols)
                rows.append(r)
        finally:
            for job in jobs:
                job[-1].cancel()
        return C.concat_columns(parts), np.concatenate(rows)

    @staticmethod
    def _lines_of(parts, offs, values, ends) -> tuple:
        """The lines of the messages `values` joined by line breaks (`ends`: the breaks),
        and each message's first line."""
        sizes = np.fromiter(map(len, values), np.int64, len(values))
        after = np.cumsum(sizes + 1) - 1  # each message's closing line break
        message = np.searchsorted(after, ends)  # each line's message
        first = np.searchsorted(ends, after - sizes)  # each message's first line
        within = np.arange(len(ends)) - first[message]
        count = np.diff(np.append(first, len(ends)))
        starts = np.concatenate([[0], ends[:-1] + 1])
        # A message's trailing line break ends its last row (the empty line after it
        # is no row of its own).
        trailing = (ends == starts) & (within == count[message] - 1) & (within > 0)
        rows = count - np.bincount(message[trailing], minlength=len(values))
        units = _Units(
            parts[message],
            offs[message],
            within,
            rows[message] > 1,
            within >= rows[message] - 1,
        )
        return units, first

    def _parse_csv_block(self, data: bytes, idx: np.ndarray, table):
        """Converts the lines `data` (the block's rows `idx`) that Arrow parsed (`table`,
        None where Arrow rejected them); (columns, row indices)."""
        # Lines are numbered by their index among `idx`; the error log maps them back.
        units = self._errors.units
        self._errors.units = units[idx]
        try:
            cols, rows = self._parse_csv(self.topic, self._names, data, 0, 0, False, table)
        finally:
            self._errors.units = units
        return cols, idx[rows]

    def _parse_example_messages(self, values):
        import tensorflow as tf

        ok = np.array([v is not None for v in values], bool)
        for j in np.flatnonzero(~ok):
            self._errors.record(None, None, j, "empty message (null value)")
        idx = np.flatnonzero(ok)
        if not len(idx):
            return C.empty_like(self._streams), idx
        raw = [values[j] for j in idx]
        if self._kinds is None:
            self._kinds = self._detect_kinds(raw[0])
        # Rows are numbered by their index among `idx`; the error log maps them back.
        units = self._errors.units
        self._errors.units = units[idx]
        try:
            try:
                _, _, lengths, parsed = self._converter()(tf.constant(raw))
            except (tf.errors.InvalidArgumentError, UnicodeDecodeError):  # name the non-Examples
                block = np.empty(len(raw), object)
                block[:] = raw
                cols, rows = self._parse_slowly(self.topic, block, 0, 0)
            else:
                n = len(raw)
                cols, rows = self._to_columns(
                    self.topic,
                    n,
                    {c: v.numpy() for c, v in lengths.items()},
                    {c: v.numpy() for c, v in parsed.items()},
                    np.arange(n, dtype=np.int64),
                    np.ones(n, bool),
                )
        finally:
            self._errors.units = units
        return cols, idx[rows]

    def _parse_json_messages(self, parts, offs, values):
        label, dense, categorical, multi = self._roles
        data = {c: [] for c in self._wanted}
        unit = ([], [], [], [], [])  # partition, offset, row within, several, last
        rows = []
        for j, v in enumerate(values):
            try:
                objs = [json.loads(v)] if v is not None else [None]
            except (ValueError, UnicodeDecodeError) as err:
                lines = v.split(b"\n") if b"\n" in v.strip() else None
                if lines is None:  # one malformed object
                    objs = [err]
                else:  # JSON lines: a row per line (a trailing line break ends the last)
                    if not lines[-1].strip():
                        lines.pop()
                    objs = []
                    for ln in lines:
                        try:
                            objs.append(json.loads(ln) if ln.strip() else ...)
                        except (ValueError, UnicodeDecodeError) as line_err:
                            objs.append(line_err)
            for k, obj in enumerate(objs):
                k = k if len(objs) > 1 else -1  # (-1: the message is the row)
                unit[0].append(parts[j])
                unit[1].append(offs[j])
                unit[2].append(max(k, 0))
                unit[3].append(k >= 0)
                unit[4].append(k == len(objs) - 1 or k < 0)
                if obj is ...:  # a blank line
                    continue
                if isinstance(obj, Exception):
                    reason = f"invalid JSON ({obj})"
                elif not isinstance(obj, dict):
                    what = "null" if obj is None else type(obj).__name__
                    reason = f"a message must be a JSON object, found {what}"
                    if obj is None and v is None:
                        reason = "empty message (null value)"
                else:
                    reason, row = self._json_row(obj)
                if reason is not None:
                    self._errors.pending.append((int(parts[j]), int(offs[j]), k, reason))
                    continue
                rows.append(len(unit[0]) - 1)
                for c in self._wanted:
                    data[c].append(row[c])
        self._errors.units = _Units(
            *(np.asarray(a, t) for a, t in zip(unit, _UNIT_TYPES, strict=True))
        )
        table = pa.table(
            {
                **{c: pa.array(data[c], pa.float64()) for c in self._numeric},
                **{c: pa.array(data[c], pa.string()) for c in categorical},
                **{c: pa.array(data[c], pa.list_(pa.string())) for c in multi},
            }
        )
        cols = _convert.convert_table(table, self._roles, separator=self._separator)
        return cols, np.asarray(rows, np.int64)

    def _json_row(self, obj: dict):
        label, dense, categorical, multi = self._roles
        row = {}
        if obj.get(label) is None:
            return f"empty label {label!r}", None
        for c in self._numeric:
            x = obj.get(c)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
                return f"wrong type in column {c!r}: expected a number, found {x!r}", None
            row[c] = None if x is None else float(x)
        for c in categorical:
            x = obj.get(c)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, str))):
                return (
                    f"wrong type in column {c!r}: expected a string or an integer, found {x!r}",
                    None,
                )
            row[c] = None if x is None else str(x)
        for c in multi:
            x = obj.get(c)
            if x is None:
                row[c] = []
            elif isinstance(x, str):
                row[c] = x.split(self._separator)
            elif isinstance(x, list) and all(
                isinstance(i, (int, str)) and not isinstance(i, bool) for i in x
            ):
                row[c] = [str(i) for i in x]
            else:
                return (
                    f"wrong type in column {c!r}: expected text or a list of strings or "
                    f"integers, found {x!r}",
                    None,
                )
        return None, row

    # -- buffering ----------------------------------------------------------

    def _reset_buffer(self) -> None:
        self._blocks = []  # [columns, _Units, consumed, {partition: end offset}]
        self._buffered = 0
        self._eof: dict[int, int] = {}  # partition -> the end offset it last reported
        self._fetched: dict[int, int] = {}  # partition -> offset after the last message fetched

    def _take(self, m: int) -> dict:
        """Consumes the next `m` buffered rows and advances the consumed offsets."""
        parts = []
        left = m
        while left > 0:
            block = self._blocks[0]
            cols, units, off = block[:3]
            k = min(len(units.parts) - off, left)
            parts.append(C.slice_columns(cols, off, off + k))
            taken = units.parts[off : off + k]
            for p in np.unique(taken).tolist():
                j = off + int(np.flatnonzero(taken == p)[-1])  # p's last row taken
                if units.last[j]:
                    self._offsets[p] = int(units.offsets[j]) + 1
                    self._rows.pop(p, None)
                else:  # inside a message: its rows up to j are consumed
                    self._offsets[p] = int(units.offsets[j])
                    self._rows[p] = int(units.within[j]) + 1
            block[2] = off + k
            left -= k
            self._buffered -= k
            self._pop_done()
        if not parts:
            return C.empty_like(self._streams)
        return C.concat_columns(parts)

    def _pop_done(self) -> None:
        """Drops the blocks read to their end: their skipped (malformed) messages are passed."""
        while self._blocks and self._blocks[0][2] == len(self._blocks[0][1].parts):
            for p, end in self._blocks.pop(0)[3].items():
                if end > self._offsets.get(p, 0):
                    self._offsets[p] = end
                    self._rows.pop(p, None)

    def _minibatch(self, cols: dict, sweep_end: bool) -> dict:
        n = len(cols[self.label_name])
        return {
            info: MinibatchData(C.to_output(cols[info.name]), n, n, sweep_end)
            for info in self._streams
        }

    def _is_ahead(self, where: str, offset: int, within: int = 0) -> bool:
        p = int(where.rsplit(" ", 1)[1])
        return (offset, within) >= (self._offsets.get(p, 0), self._rows.get(p, 0))
