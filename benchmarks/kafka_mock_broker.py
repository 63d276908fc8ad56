"""A throwaway Kafka cluster on 127.0.0.1, for trying `KafkaSource` and for tests.

librdkafka (the library under confluent-kafka) carries a mock Kafka cluster that
speaks the real protocol on loopback: a client configured with
`test.mock.num.brokers` starts it inside its process. This script starts one,
prints its `bootstrap.servers` address on the first line of stdout, and keeps
it up until SIGTERM/SIGINT arrives, `--seconds` pass or (`--stop_on_stdin_eof`)
stdin closes. Topics
are created on first produce with 4 partitions; nothing is stored
on disk, and a partition keeps a bounded log (100,000 Criteo lines in one topic
already lose their oldest messages). Any client (another process too) connects to the printed address like
to a real cluster:

    python benchmarks/kafka_mock_broker.py --seconds=600 &
    # -> 127.0.0.1:40123
    python -m npu_rec.scripts.produce_sample --kafka=127.0.0.1:40123 --topic=clicks
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    parser.add_argument("--brokers", type=int, default=1, help="mock brokers")
    parser.add_argument(
        "--stop_on_stdin_eof", action="store_true", help="also stop when stdin closes"
    )
    args = parser.parse_args(argv)
    import confluent_kafka

    client = confluent_kafka.Producer(
        {
            "test.mock.num.brokers": args.brokers,
            "test.mock.broker.rtt": 0,
            "log_level": 3,
        }
    )
    brokers = client.list_topics(timeout=10).brokers.values()
    print(",".join(f"{b.host}:{b.port}" for b in brokers), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def stdin_closed():
        sys.stdin.read()
        stop.set()

    if args.stop_on_stdin_eof:
        threading.Thread(target=stdin_closed, daemon=True).start()
    stop.wait(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
