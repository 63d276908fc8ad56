r"""Writes click-log rows into a Kafka topic, to try `--kafka` training locally.

Each row is one comma-separated line: Criteo's label, I1-I13, C1-C26 (the
format `online_train --kafka` reads by default); a message holds
`--rows_per_message` consecutive rows joined by line breaks (one by default;
several make the topic far cheaper to read). The rows are the shipped Criteo
sample (`--rows=0`, repeated `--repeat` times) or `--rows` generated Criteo-like
rows (`--seed`). Messages are spread over the topic's partitions in turn; a
topic that does not exist is created by the cluster (where it creates topics on
first use) with its default partition count.

Examples:
  python -m npu_rec.scripts.produce_sample --kafka=localhost:9092 --topic=clicks
  python -m npu_rec.scripts.produce_sample --kafka=localhost:9092 --topic=clicks --rows=100000
  python -m npu_rec.scripts.produce_sample --kafka=localhost:9092 --topic=clicks --rows_per_message=64
  python -m npu_rec.scripts.online_train --kafka=localhost:9092 --topic=clicks --max_steps=50
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from npu_rec.scripts import _cli
from npu_rec.scripts import _flags as F

ROWS = flags.DEFINE_integer(
    "rows", 0, "Generated rows to write; 0 writes the shipped Criteo sample.", lower_bound=0
)
REPEAT = flags.DEFINE_integer("repeat", 1, "Times the sample is written.", lower_bound=1)
ROWS_PER_MESSAGE = flags.DEFINE_integer(
    "rows_per_message",
    1,
    "Rows per message (consecutive lines joined by line breaks; the last may hold fewer).",
    lower_bound=1,
)


def sample_lines() -> list[bytes]:
    """The shipped Criteo sample's data lines (label, I1-I13, C1-C26), without the header."""
    from npu_rec.data import sample_path

    with open(sample_path("criteo_sample"), "rb") as f:
        lines = f.read().splitlines()
    return [ln for ln in lines[1:] if ln.strip()]


def generated_lines(n: int, seed: int, start: int = 0) -> list[bytes]:
    """`n` Criteo-like rows of the synthetic generator as lines (categorical ids as text)."""
    from npu_rec.data import CATEGORICAL_NAMES, DENSE_NAMES, SyntheticCriteo

    rows = SyntheticCriteo(seed=seed).rows(start, start + n)
    cols = [rows["label"].astype(int).tolist()]
    cols += [rows[c].tolist() for c in DENSE_NAMES]
    cols += [rows[c].tolist() for c in CATEGORICAL_NAMES]
    return [
        ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in r).encode()
        for r in zip(*cols, strict=True)
    ]


def messages(lines, rows_per_message: int = 1) -> list[bytes]:
    """`lines` (bytes) joined into messages of `rows_per_message` rows each, in order."""
    if rows_per_message == 1:
        return list(lines)
    return [
        b"\n".join(lines[i : i + rows_per_message]) for i in range(0, len(lines), rows_per_message)
    ]


def produce(bootstrap_servers: str, topic: str, lines, timeout: float = 60.0) -> int:
    """Writes `lines` (bytes, one message each) to `topic`, over its partitions in turn."""
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "enable.idempotence": True}
    )
    md = producer.list_topics(topic, timeout=timeout).topics.get(topic)
    partitions = sorted(md.partitions) if md is not None and md.partitions else [None]
    for i, line in enumerate(lines):
        p = partitions[i % len(partitions)]
        while True:
            try:
                if p is None:
                    producer.produce(topic, line)
                else:
                    producer.produce(topic, line, partition=p)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: wait for deliveries
    left = producer.flush(timeout)
    if left:
        raise RuntimeError(f"{left} messages to topic {topic!r} were not delivered in {timeout}s")
    return len(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not F.KAFKA.value or not F.TOPIC.value:
        raise app.UsageError("--kafka and --topic are required")
    rows, seed = ROWS.value, F.SEED.value
    lines = generated_lines(rows, seed) if rows else sample_lines() * REPEAT.value
    n = produce(F.KAFKA.value, F.TOPIC.value, messages(lines, ROWS_PER_MESSAGE.value))
    print(
        f"npu_rec: wrote {len(lines)} rows in {n} messages to topic {F.TOPIC.value!r} at "
        f"{F.KAFKA.value}",
        flush=True,
    )


if __name__ == "__main__":
    _cli.run(
        main,
        __doc__,
        own=("rows", "repeat", "rows_per_message"),
        groups=(("kafka", ("kafka", "topic", "seed")),),
    )
