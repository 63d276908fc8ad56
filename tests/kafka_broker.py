"""A Kafka cluster on 127.0.0.1 for tests: librdkafka's mock cluster in its own process."""

import contextlib
import os
import subprocess
import sys
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def mock_broker(seconds: int = 240):
    """Yields the cluster's bootstrap address; the broker process stops on leaving (or after
    `seconds`)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "kafka_mock_broker.py"),
            f"--seconds={seconds}",
            "--stop_on_stdin_eof",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        yield address
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def produce(address, topic, messages, partition_of=lambda i: i % 4):
    """Writes `messages` (str or bytes) to `topic`, message i to partition `partition_of(i)`."""
    import confluent_kafka as ck

    producer = ck.Producer({"bootstrap.servers": address})
    for i, m in enumerate(messages):
        value = m if isinstance(m, bytes) else m.encode()
        producer.produce(topic, value, partition=partition_of(i))
    assert producer.flush(20) == 0


def topic_with(address, messages, **kwargs):
    """A new topic holding `messages`."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    produce(address, topic, messages, **kwargs)
    return topic
