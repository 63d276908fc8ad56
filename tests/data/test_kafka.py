"""KafkaSource against a Kafka cluster on 127.0.0.1 (librdkafka's mock cluster, in its own process)."""

import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ck = pytest.importorskip("confluent_kafka")

from npu_rec.data import CsvSource, KafkaSource, MalformedRecordError, as_dataset  # noqa: E402
from npu_rec.data import _kafka as kafka_module  # noqa: E402
from tests.kafka_broker import mock_broker, produce, topic_with  # noqa: E402

COLUMNS = ["label", "rid", "x", "c", "tags"]
ROLES = dict(label="label", dense=("rid", "x"), categorical=("c",), multi_valued=("tags",))


@pytest.fixture(scope="module")
def broker():
    """The cluster's bootstrap address; the broker process stops at the end of the module."""
    with mock_broker() as address:
        yield address


def line(i):
    x = "" if i % 5 == 0 else repr(i * 0.5)
    c = "" if i % 7 == 0 else f"v{i % 4}"
    return f"{i % 2},{i},{x},{c},{'|'.join(f't{j}' for j in range(i % 3))}"


def source(address, topic, **kwargs):
    # Long enough for a loaded machine to fetch what is already in the topic; a test of a
    # quiet stream passes its own short wait.
    kwargs.setdefault("max_wait_ms", 1500)
    return KafkaSource(topic, bootstrap_servers=address, columns=COLUMNS, **ROLES, **kwargs)


def read_rids(src, batch, steps, w=1, r=0):
    out = []
    for _ in range(steps):
        mb = src.next_minibatch(batch, w, r)
        out.extend(mb[src.stream("rid")].data.astype(int).tolist())
    return out


def test_rows_match_the_csv_source_on_the_same_lines(broker, tmp_path):
    n = 40
    topic = topic_with(broker, [line(i) for i in range(n)], partition_of=lambda i: 0)
    path = tmp_path / "rows.csv"
    path.write_text(",".join(COLUMNS) + "\n" + "\n".join(line(i) for i in range(n)) + "\n")
    with source(broker, topic) as kafka, CsvSource(str(path), **ROLES) as csv:
        a, b = kafka.next_minibatch(n), csv.next_minibatch(n)
        for name in COLUMNS:
            x, y = a[kafka.stream(name)].data, b[csv.stream(name)].data
            if name == "tags":
                np.testing.assert_array_equal(x.values.numpy(), y.values.numpy())
                np.testing.assert_array_equal(x.row_splits.numpy(), y.row_splits.numpy())
            else:
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert not a[kafka.stream("label")].sweep_end


def test_a_restored_source_reads_every_row_once(broker):
    n = 200
    topic = topic_with(broker, [line(i) for i in range(n)])
    src = source(broker, topic)
    seen = read_rids(src, 16, 5)
    state = json.loads(json.dumps(src.get_checkpoint_state()))
    assert sorted(int(p) for p in state["offsets"]) == [0, 1, 2, 3]
    read_rids(src, 16, 3)  # read past the saved state: lost with the process
    src.close()
    again = source(broker, topic)
    again.restore_from_checkpoint(state)
    seen += read_rids(again, 20, 6)
    assert sorted(seen) == list(range(n))
    assert len(again.next_minibatch(8)[again.stream("rid")].data) == 0  # quiet: empty batch
    again.close()


def test_workers_read_disjoint_partitions_and_together_every_row_across_a_restart(broker):
    n = 120
    topic = topic_with(broker, [line(i) for i in range(n)])
    a, b = source(broker, topic), source(broker, topic)
    ra, rb = read_rids(a, 10, 6, 2, 0), read_rids(b, 10, 2, 2, 1)
    saved = json.loads(json.dumps(b.get_checkpoint_state()))
    assert sorted(saved["offsets"]) == ["1", "3"]  # only its own partitions
    read_rids(b, 10, 2, 2, 1)  # worker 1 reads on, then is killed: lost with its process
    b.close()
    b = source(broker, topic)
    b.restore_from_checkpoint(saved)
    rb += read_rids(b, 10, 4, 2, 1)
    assert a.assigned_partitions == [0, 2] and b.assigned_partitions == [1, 3]
    assert {i % 4 for i in ra} == {0, 2} and {i % 4 for i in rb} == {1, 3}
    assert sorted(ra + rb) == list(range(n))
    assert sum(b.get_checkpoint_state()["offsets"].values()) == 60
    a.close()
    b.close()


def test_start_and_explicit_partitions(broker):
    n = 40
    topic = topic_with(broker, [line(i) for i in range(n)])
    src = source(broker, topic, partitions=[1], start={1: 5})
    assert read_rids(src, 5, 1) == [21, 25, 29, 33, 37]
    src.close()
    late = source(broker, topic, start="latest")
    assert read_rids(late, 4, 1) == []
    produce(broker, topic, [line(i) for i in range(n, n + 8)])
    assert sorted(read_rids(late, 8, 1)) == list(range(n, n + 8))
    late.close()


def test_malformed_messages_name_topic_partition_and_offset(broker):
    bad = ["0,1,2", "1,2,abc,c,t", "nan,3,1,c,t", "1,4,5,c\n1,5,6,c,t", "", "0,6,inf,c,t"]
    topic = topic_with(broker, [line(100), *bad, line(101)], partition_of=lambda i: 2)
    with pytest.raises(MalformedRecordError, match=rf"topic '{topic}' partition 2, offset 1: "):
        with source(broker, topic) as strict:
            strict.next_minibatch(2)
    src = source(broker, topic, on_error="skip")
    # Offset 4 holds two rows: the second is read, the first is malformed.
    assert read_rids(src, 3, 1) == [100, 5, 101]
    report = src.error_report()
    assert report["count"] == 5  # the empty message is a blank line: ignored, as in a file
    offsets = [e["offset"] for e in report["examples"]]
    assert offsets == [1, 2, 3, 4, 6]
    assert "wrong number of fields" in report["examples"][0]["reason"]
    assert "empty label" in report["examples"][2]["reason"]  # "nan" reads as empty, as in files
    assert report["examples"][3]["row_in_record"] == 0
    assert "wrong number of fields" in report["examples"][3]["reason"]
    assert "non-finite value inf" in report["examples"][4]["reason"]
    assert src.get_checkpoint_state()["offsets"]["2"] == 8
    src.close()


def test_json_messages(broker):
    msgs = [
        json.dumps({"label": 1, "rid": 7, "x": 0.5, "c": "v1", "tags": ["t0", "t1"]}),
        json.dumps({"label": 0, "rid": 8, "c": 3, "tags": "t0|t1"}),
        json.dumps({"label": 0, "rid": "9"}),
        "[1, 2]",
        "{not json",
    ]
    topic = topic_with(broker, msgs, partition_of=lambda i: 0)
    src = KafkaSource(
        topic, bootstrap_servers=broker, format="json", on_error="skip", max_wait_ms=1500, **ROLES
    )
    mb = src.next_minibatch(2)
    assert mb[src.stream("rid")].data.tolist() == [7.0, 8.0]
    assert mb[src.stream("x")].data.tolist() == [0.5, 0.0]
    tags = mb[src.stream("tags")].data
    assert tags[0].numpy().tolist() == tags[1].numpy().tolist()
    reasons = [e["reason"] for e in src.error_report()["examples"]]
    assert "wrong type in column 'rid'" in reasons[0]
    assert "JSON object" in reasons[1] and "invalid JSON" in reasons[2]
    src.close()


def test_as_dataset_reads_the_stream(broker):
    topic = topic_with(broker, [line(i) for i in range(64)])
    src = source(broker, topic)
    # No read-ahead: a prefetching iterator left while the stream is quiet would wait in
    # its pending read until the next message arrives.
    ds = as_dataset(src, 16, num_sweeps=None, prefetch=0)
    rids = []
    for feats, _ in ds.take(4):
        rids += feats["rid"].numpy().astype(int).tolist()
    assert sorted(rids) == list(range(64))
    assert sorted(ds.reading_position.state_after(4)["offsets"].values()) == [16] * 4
    src.close()


def test_offsets_reach_the_broker_only_when_committed(broker):
    topic = topic_with(broker, [line(i) for i in range(40)])
    src = source(broker, topic, group_id=f"g-{topic}")
    read_rids(src, 8, 2)
    state = src.get_checkpoint_state()
    admin = ck.Consumer({"bootstrap.servers": broker, "group.id": f"g-{topic}"})
    parts = [ck.TopicPartition(topic, p) for p in range(4)]
    assert [tp.offset for tp in admin.committed(parts, timeout=10)] == [ck.OFFSET_INVALID] * 4
    src.checkpoint_committed(state)
    expected = [state["offsets"][str(p)] for p in range(4)]
    assert sum(expected) == 16
    for _ in range(100):  # the commit is asynchronous
        got = [tp.offset for tp in admin.committed(parts, timeout=10)]
        if got == expected:
            break
        time.sleep(0.1)
    assert got == expected
    admin.close()
    src.close()


def test_bad_arguments_name_the_argument(broker):
    with pytest.raises(ValueError, match="format"):
        KafkaSource("t", bootstrap_servers=broker, columns=COLUMNS, label="label", format="xml")
    with pytest.raises(ValueError, match="columns"):
        KafkaSource("t", bootstrap_servers=broker, label="label")
    with pytest.raises(ValueError, match="start"):
        KafkaSource("t", bootstrap_servers=broker, columns=COLUMNS, label="label", start="middle")
    src = source(broker, topic_with(broker, [line(0)]))
    with pytest.raises(ValueError, match="number_of_workers"):
        src.next_minibatch(1, 5, 4)
    src.close()


def test_a_prefetching_dataset_left_during_a_pause_ends_after_stop(broker):
    topic = topic_with(broker, [line(i) for i in range(32)])
    src = source(broker, topic, max_wait_ms=200)
    ds = as_dataset(src, 16, num_sweeps=None, prefetch=2)
    start = time.monotonic()
    for k, _ in enumerate(ds):
        if k == 1:  # both batches read; the read-ahead now waits on a quiet stream
            ds.reading_position.stop()
            break
    assert time.monotonic() - start < 30
    assert sorted(ds.reading_position.state_after(2)["offsets"].values()) == [8] * 4
    src.close()


def test_stop_at_end_ends_a_sweep_after_every_message(broker):
    topic = topic_with(broker, [line(i) for i in range(50)])
    src = source(broker, topic, stop_at_end=True)
    rids, ends = [], 0
    while not ends:
        mb = src.next_minibatch(8)
        rids += mb[src.stream("rid")].data.astype(int).tolist()
        ends += mb[src.stream("rid")].sweep_end
    assert sorted(rids) == list(range(50))
    src.close()


def example(i, **override):
    """Row `line(i)` as a serialized tf.train.Example (a feature set to None is left out)."""
    import tensorflow as tf

    values = {
        "label": [float(i % 2)],
        "rid": [float(i)],
        "x": [] if i % 5 == 0 else [i * 0.5],
        "c": [] if i % 7 == 0 else [f"v{i % 4}".encode()],
        "tags": [f"t{j}".encode() for j in range(i % 3)],
        **override,
    }
    feature = {}
    for name, v in values.items():
        if v is None:
            continue
        if v and isinstance(v[0], bytes):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
        elif name in ("c", "tags"):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=v))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_tf_example_messages_match_the_csv_source_and_name_bad_ones(broker, tmp_path):
    n = 30
    msgs = [example(i) for i in range(n)]
    bad = {
        3: b"not a protobuf \xff\xff",
        8: example(8, label=None),
        11: example(11, x=[float("inf")]),
        17: example(17, c=[b"a", b"b"]),
    }
    for j, m in bad.items():
        msgs[j] = m
    topic = topic_with(broker, msgs, partition_of=lambda i: 1)
    with pytest.raises(MalformedRecordError, match=rf"topic '{topic}' partition 1, offset 3: "):
        with source(broker, topic, format="tf_example") as strict:
            strict.next_minibatch(4)
    good = [i for i in range(n) if i not in bad]
    path = tmp_path / "rows.csv"
    path.write_text(",".join(COLUMNS) + "\n" + "\n".join(line(i) for i in good) + "\n")
    src = source(broker, topic, format="tf_example", on_error="skip")
    with CsvSource(str(path), **ROLES) as csv:
        a, b = src.next_minibatch(len(good)), csv.next_minibatch(len(good))
        for name in COLUMNS:
            x, y = a[src.stream(name)].data, b[csv.stream(name)].data
            if name == "tags":
                np.testing.assert_array_equal(x.values.numpy(), y.values.numpy())
                np.testing.assert_array_equal(x.row_splits.numpy(), y.row_splits.numpy())
            else:
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    report = src.error_report()
    assert [e["offset"] for e in report["examples"]] == sorted(bad)
    assert all(e["file"] == f"topic '{topic}' partition 1" for e in report["examples"])
    reasons = [e["reason"] for e in report["examples"]]
    assert "not a valid tf.train.Example" in reasons[0]
    assert "label 'label' must hold 1-1 values, found 0" in reasons[1]
    assert "non-finite value inf" in reasons[2]
    assert "categorical feature 'c' must hold 0-1 values, found 2" in reasons[3]
    assert src.get_checkpoint_state()["offsets"]["1"] == n
    src.close()


def test_a_commit_while_another_thread_waits_on_a_quiet_stream_does_not_wait(broker):
    import threading

    topic = topic_with(broker, [line(i) for i in range(16)])
    src = source(broker, topic, group_id=f"g-{topic}", max_wait_ms=3000)
    read_rids(src, 16, 1)
    state = src.get_checkpoint_state()
    reader = threading.Thread(target=src.next_minibatch, args=(8,))  # waits: nothing left
    reader.start()
    time.sleep(0.5)
    start = time.monotonic()
    src.checkpoint_committed(state)  # a save's commit, while the reader waits in consume()
    assert time.monotonic() - start < 1.0
    reader.join(timeout=30)
    src.close()  # sends what is left and waits for it
    admin = ck.Consumer({"bootstrap.servers": broker, "group.id": f"g-{topic}"})
    got = admin.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=10)
    assert [tp.offset for tp in got] == [4, 4, 4, 4]
    admin.close()


# ------------------------------------------------------------- several rows per message
def messages_of(sizes, trailing=False):
    """Messages of `sizes[m]` rows each (rows numbered in order), CSV lines joined by line
    breaks (`trailing`: each message also ends with one)."""
    out, i = [], 0
    for k in sizes:
        out.append("\n".join(line(i + j) for j in range(k)) + ("\n" if trailing else ""))
        i += k
    return out, i


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=12),
    trailing=st.booleans(),
    data=st.data(),
)
def test_every_row_of_multi_row_messages_once_across_random_restores(
    broker, monkeypatch, sizes, trailing, data
):
    monkeypatch.setattr(kafka_module, "CHUNK_BYTES", 100)  # a block parsed in several chunks
    msgs, n = messages_of(sizes, trailing)
    topic = topic_with(broker, msgs)
    trained, state = [], None
    # Each run restores the last save, trains some batches, saves, reads on and crashes
    # (what it read after the save is lost). One consumer serves the runs: a restore seeks
    # it to the saved position, as a restarted process's new consumer is (tested below).
    src = source(broker, topic, stop_at_end=True, consumer_config={"fetch.wait.max.ms": 5})
    for _ in range(4 * n):
        if state is not None:
            src.restore_from_checkpoint(json.loads(json.dumps(state)))
        done = False
        for _ in range(data.draw(st.integers(1, 3), label="batches before the save")):
            mb = src.next_minibatch(data.draw(st.integers(1, 9), label="batch size"))
            trained += mb[src.stream("rid")].data.astype(int).tolist()
            done = mb[src.stream("rid")].sweep_end
            if done:
                break
        if done:
            break
        state = src.get_checkpoint_state()
        src.next_minibatch(data.draw(st.integers(1, 9), label="read past the save"))
    src.close()
    assert sorted(trained) == list(range(n))


def test_a_position_inside_a_message_and_one_saved_in_the_old_format_restore(broker):
    msgs, n = messages_of([3] * 6)
    topic = topic_with(broker, msgs, partition_of=lambda i: 0)
    src = source(broker, topic, group_id=f"g-{topic}")
    assert read_rids(src, 4, 1) == [0, 1, 2, 3]
    inside = src.get_checkpoint_state()
    # Offset 1 (rows 3-5) is partly trained: the broker gets offset 1, a restore row 4.
    assert inside["offsets"]["0"] == 1 and inside["rows"] == {"0": 1}
    assert read_rids(src, 2, 1) == [4, 5]
    boundary = src.get_checkpoint_state()
    assert boundary["offsets"]["0"] == 2 and boundary["rows"] == {}
    src.close()
    again = source(broker, topic)
    again.restore_from_checkpoint(inside)
    assert read_rids(again, 5, 1) == [4, 5, 6, 7, 8]
    again.close()
    old = {k: v for k, v in boundary.items() if k != "rows"}  # saved before "rows" existed
    again = source(broker, topic)
    again.restore_from_checkpoint(old)
    assert read_rids(again, 12, 1) == list(range(6, n))
    again.close()


def test_a_bad_row_inside_a_message_names_partition_offset_and_row(broker, monkeypatch):
    monkeypatch.setattr(kafka_module, "CHUNK_BYTES", 40)
    msgs = [f"{line(0)}\n{line(1)}", f"{line(2)}\n{line(3)}\n0,1,2\n{line(5)}", line(6)]
    topic = topic_with(broker, msgs, partition_of=lambda i: 3)
    with pytest.raises(
        MalformedRecordError,
        match=rf"topic '{topic}' partition 3, offset 1, row 2: wrong number of fields",
    ):
        with source(broker, topic) as strict:
            strict.next_minibatch(4)
    src = source(broker, topic, on_error="skip")
    assert read_rids(src, 4, 1) == [0, 1, 2, 3]
    # Read (and counted) ahead of the position (offset 1, row 2): not in the saved state.
    assert src.error_report()["count"] == 1
    state = src.get_checkpoint_state()
    assert state["rows"] == {"3": 2} and state["errors"]["count"] == 0
    assert read_rids(src, 2, 1) == [5, 6]
    assert src.get_checkpoint_state()["errors"]["count"] == 1
    (example,) = src.error_report()["examples"]
    assert (example["offset"], example["row_in_record"]) == (1, 2)
    assert example["file"] == f"topic '{topic}' partition 3"
    src.close()
    rows = [{"label": 1, "rid": 7}, {"label": 0, "rid": 8}]
    lines = "\n".join(json.dumps(r) for r in rows)
    topic = topic_with(broker, [lines + '\n{"label": 1, "rid": "x"}\n'], partition_of=lambda i: 0)
    src = KafkaSource(
        topic, bootstrap_servers=broker, format="json", on_error="skip", max_wait_ms=1500, **ROLES
    )
    assert src.next_minibatch(2)[src.stream("rid")].data.tolist() == [7.0, 8.0]
    (example,) = src.error_report()["examples"]
    assert (example["offset"], example["row_in_record"]) == (0, 2)
    assert "wrong type in column 'rid'" in example["reason"]
    src.close()
