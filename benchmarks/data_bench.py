r"""Rows/s of the npu_rec data sources beside plain pandas / pyarrow CSV reads.

Generates a Criteo-shaped TSV (label, I1-I13, C1-C26, ~10% empty fields) from
`SyntheticCriteo`, writes Parquet and TFRecord copies, then times one full
sweep of each source and plain `pandas.read_csv` / `pyarrow.csv.read_csv` of
the same file, in one run. Prints a table and writes JSON.

Examples:
  python benchmarks/data_bench.py                       # 1M rows
  python benchmarks/data_bench.py --rows=100000 --out=/tmp/data_bench.json
  python benchmarks/data_bench.py --rows=200000 --kafka_rows_per_message=1,16,64
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from absl import app, flags

from npu_rec import data as npd

_ROWS = flags.DEFINE_integer("rows", 1_000_000, "Rows of the generated file.", lower_bound=1000)
_TFRECORD_ROWS = flags.DEFINE_integer(
    "tfrecord_rows",
    100_000,
    "Rows of the TFRecord copy (writing Examples is slow).",
    lower_bound=1000,
)
_KAFKA_ROWS = flags.DEFINE_integer(
    "kafka_rows",
    50_000,
    "Rows of the file also written into a Kafka topic on a local broker for the KafkaSource "
    "row (0: no Kafka row; needs confluent-kafka). librdkafka's mock cluster drops a "
    "partition's oldest messages beyond a bounded log: 100,000 of these rows already lose some.",
    lower_bound=0,
)
_KAFKA_RPM = flags.DEFINE_list(
    "kafka_rows_per_message",
    ["1", "64"],
    "Rows per Kafka message, one topic (and one KafkaSource row) each.",
)
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Rows per minibatch.", lower_bound=1)
_OUT = flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "data_bench.json"),
    "Where to write the JSON results.",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where to write the data (default: a temp dir).")

NAMES = npd._csv.CRITEO_COLUMNS


def _table(rows: int, seed: int = 0) -> pa.Table:
    gen = npd.SyntheticCriteo(seed=seed)
    data = gen.rows(0, rows)
    rng = np.random.default_rng(seed)
    cols = {"label": pa.array(data["label"])}
    for name in NAMES[1:14]:
        cols[name] = pa.array(data[name].astype(np.int64), mask=rng.random(rows) < 0.1)
    for name in NAMES[14:]:
        ids = pa.array((data[name].view(np.uint64) >> np.uint64(36)).astype(np.int64))
        cols[name] = ids.cast(pa.string())
        cols[name] = pc.if_else(pa.array(rng.random(rows) < 0.1), "", cols[name])
    return pa.table(cols)


def _kafka_rows(tsv: str, n: int, batch: int, add, results) -> None:
    """KafkaSource from a broker on 127.0.0.1, and CsvSource over the same `n` lines."""
    import subprocess
    import sys

    import confluent_kafka

    with open(tsv, "rb") as f:
        lines = [f.readline().rstrip(b"\n") for _ in range(n)]
    head = os.path.join(os.path.dirname(tsv), "kafka_rows.tsv")
    with open(head, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    broker = subprocess.Popen(
        [
            sys.executable,
            os.path.join(os.path.dirname(__file__), "kafka_mock_broker.py"),
            "--seconds=900",
            "--stop_on_stdin_eof",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        address = broker.stdout.readline().strip()
        producer = confluent_kafka.Producer({"bootstrap.servers": address, "linger.ms": 20})
        rpms = [int(r) for r in _KAFKA_RPM.value]
        for rpm in rpms:
            for i, k in enumerate(range(0, n, rpm)):
                while True:
                    try:
                        producer.produce(
                            f"bench-{rpm}", b"\n".join(lines[k : k + rpm]), partition=i % 4
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
        assert producer.flush(60) == 0, "messages not delivered to the local broker"
        del lines
        cat = list(NAMES[14:])

        def kafka(rpm):
            src = npd.KafkaSource(
                f"bench-{rpm}",
                bootstrap_servers=address,
                columns=list(NAMES),
                label="label",
                dense=NAMES[1:14],
                categorical=cat,
                delimiter="\t",
                stop_at_end=True,
            )
            with src:
                return _sweep(src, batch)

        def consume_only():
            """The client alone: the 1-row topic's `n` messages taken, nothing parsed."""
            c = confluent_kafka.Consumer({"bootstrap.servers": address, "group.id": "raw"})
            start = confluent_kafka.OFFSET_BEGINNING
            c.assign([confluent_kafka.TopicPartition("bench-1", p, start) for p in range(4)])
            got, deadline = 0, time.monotonic() + 300
            while got < n and time.monotonic() < deadline:
                got += sum(m.error() is None for m in c.consume(4096, 0.1))
            c.close()
            return got

        # CsvSource is timed before and after the Kafka rows; the faster run is the reference.
        csv = [_timed(lambda: _sweep(npd.CsvSource.criteo(head), batch))]
        timed = {rpm: _timed(lambda rpm=rpm: kafka(rpm)) for rpm in rpms}
        n_c, s_c = _timed(consume_only) if 1 in rpms else (0, 0.0)
        csv.append(_timed(lambda: _sweep(npd.CsvSource.criteo(head), batch)))
        n_csv, s_csv = min(csv, key=lambda t: t[1])
        add(
            "CsvSource (Kafka's rows)",
            n_csv,
            s_csv,
            f"the {n_csv} rows in the topics, from a file (best of 2)",
        )
        for rpm, (n_k, s_k) in timed.items():
            if n_k != n_csv:  # e.g. a cluster that keeps less than the topic was given
                raise RuntimeError(f"KafkaSource read {n_k} of the {n_csv} rows written")
            ratio = (n_k / s_k) / (n_csv / s_csv)
            add(
                f"KafkaSource {rpm} row/msg",
                n_k,
                s_k,
                f"local broker, 4 partitions; {ratio:.2f}x CsvSource same rows",
            )
        if n_c:
            n_k, s_k = timed[1]
            add(
                "confluent-kafka consume",
                n_c,
                s_c,
                f"the client alone, 1 row/msg, no parsing; KafkaSource is "
                f"{(n_k / s_k) / (n_c / s_c):.2f}x it",
            )
    finally:
        broker.stdin.close()
        broker.wait(timeout=30)


def _sweep(source, batch: int) -> int:
    n = 0
    while True:
        mb = source.next_minibatch(batch)
        first = next(iter(mb.values()))
        n += first.num_samples
        if first.sweep_end:
            return n


def _timed(fn):
    start = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - start


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import pandas as pd
    import tensorflow as tf

    workdir = _WORKDIR.value or tempfile.mkdtemp(prefix="npu_rec_data_bench_")
    os.makedirs(workdir, exist_ok=True)
    try:
        _run(workdir, pd, tf)
    finally:
        if not _WORKDIR.value:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(workdir, pd, tf):
    rows, batch = _ROWS.value, _BATCH.value
    table = _table(rows)
    tsv = os.path.join(workdir, "criteo.tsv")
    pacsv.write_csv(
        table,
        tsv,
        pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"),
    )
    parquet = os.path.join(workdir, "criteo.parquet")
    pq.write_table(table, parquet, row_group_size=65536)
    tfrecord = os.path.join(workdir, "criteo.tfrecord")
    small = table.slice(0, min(_TFRECORD_ROWS.value, rows)).to_pydict()
    for name in NAMES[1:14]:
        small[name] = [None if v is None else float(v) for v in small[name]]
    npd.write_examples(tfrecord, small)

    results = []

    def add(name, n, seconds, note=""):
        results.append(
            {
                "reader": name,
                "rows": n,
                "seconds": round(seconds, 3),
                "rows_per_sec": round(n / seconds),
                "note": note,
            }
        )

    n, s = _timed(lambda: len(pd.read_csv(tsv, sep="\t", header=None, names=list(NAMES))))
    add("pandas.read_csv", n, s, "parse only, no hashing")
    n, s = _timed(
        lambda: (
            pacsv.read_csv(
                tsv, pacsv.ReadOptions(column_names=list(NAMES)), pacsv.ParseOptions(delimiter="\t")
            ).num_rows
        )
    )
    add("pyarrow.csv.read_csv", n, s, "parse only, no hashing")
    n, s = _timed(lambda: _sweep(npd.CsvSource.criteo(tsv), batch))
    add("CsvSource.criteo", n, s, "streaming, hashed, minibatches")
    cat = list(NAMES[14:])
    n, s = _timed(
        lambda: _sweep(
            npd.ParquetSource(parquet, label="label", dense=NAMES[1:14], categorical=cat), batch
        )
    )
    add("ParquetSource", n, s, "row groups of 65536")
    n, s = _timed(
        lambda: _sweep(
            npd.TFRecordSource(tfrecord, label="label", dense=NAMES[1:14], categorical=cat), batch
        )
    )
    add("TFRecordSource", n, s, f"{len(small['label'])}-row copy")
    n, s = _timed(lambda: _sweep(npd.SyntheticSource(num_rows=rows), batch))
    add("SyntheticSource", n, s, "generated on the fly")

    def through_tf_data():
        ds = npd.as_dataset(npd.CsvSource.criteo(tsv), batch, use_dynamic=True)
        return sum(int(lbl.shape[0]) for _, lbl in ds)

    n, s = _timed(through_tf_data)
    add("as_dataset(CsvSource)", n, s, "tf.data, prefetch 2")

    if _KAFKA_ROWS.value:
        _kafka_rows(tsv, min(_KAFKA_ROWS.value, rows), batch, add, results)

    arrow = next(r for r in results if r["reader"] == "pyarrow.csv.read_csv")["rows_per_sec"]
    print(f"{'reader':<24}{'rows':>10}{'seconds':>10}{'rows/s':>12}{'x pyarrow':>11}  note")
    for r in results:
        r["vs_pyarrow"] = round(r["rows_per_sec"] / arrow, 2)
        print(
            f"{r['reader']:<24}{r['rows']:>10}{r['seconds']:>10.2f}{r['rows_per_sec']:>12,}"
            f"{r['vs_pyarrow']:>11.2f}  {r['note']}"
        )
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pyarrow": pa.__version__,
            "tensorflow": tf.__version__,
        },
        "command": " ".join(["python", *sys.argv]),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "file_bytes": os.path.getsize(tsv),
        "results": results,
    }
    with open(_OUT.value, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
