"""Tiered tables (`memory_rows`, `ssd_path`) against in-memory tables fed the same batches.

With a tiny `memory_rows` every training step promotes and demotes, and with
tiny segment files every few steps seal, compact or delete a segment. After
every operation the tiered table's whole exported state (keys, rows, slots,
counts, last-seen) must equal the in-memory table's, on the stock and the
kernel lookup path, through eviction, growth, delta and full saves, and
restores of each table's checkpoints into the other kind of table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build, _key_map
from npu_rec.checkpoint import CheckpointCorruptedError, TableCheckpointManager, _cold
from npu_rec.table import _registry, _tier_store
from tests.table.tier_driver import (
    HAVE_CXX,
    PATHS,
    TablePair,
    assert_same_bits,
    small_segments,  # noqa: F401 (the fixture, used by `pytestmark`)
)

DIM = 3
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Every test: segment files of a few records (and a fresh table registry).
pytestmark = pytest.mark.usefixtures("small_segments")


_op = st.one_of(
    st.tuples(
        st.just("train"),
        st.lists(st.integers(-3, 40), min_size=1, max_size=12, unique=True),
        st.integers(0, 3),
    ),
    st.tuples(st.just("evict"), st.integers(0, 4)),
    st.tuples(st.just("save"), st.sampled_from(["full", "delta"])),
    st.tuples(st.just("restore"), st.sampled_from(["own", "other"])),
    st.tuples(st.just("swap"), st.just(0)),
)


def _run(
    tmp_path, mode, kernels, ops, *, optimizer="adagrad", access=0, evict=4, shards=1, **extra
):
    kwargs = {
        **extra,
        "access_threshold": access,
        "eviction_threshold": evict,
        "dynamic_expansion": True,
        "capacity": 4,
        "num_shards": shards,
    }
    pair = TablePair(
        mode, "t", DIM, optimizer, kernels, 3 * shards, str(tmp_path / "ssd"), **kwargs
    )
    managers = [d.manager(str(tmp_path / f"ckpt{i}")) for i, d in enumerate(pair.both)]
    rng = np.random.default_rng(len(ops))
    clock, version, saved = 100, 0, False
    try:
        for op in ops:
            if op[0] == "train":
                clock += op[2]
                pair.train(op[1], clock, rng)
            elif op[0] == "evict":
                pair.evict(clock + op[1])
            elif op[0] == "save":
                version += 1
                for d, m in zip(pair.both, managers, strict=True):
                    m.save(version, delta=op[1] == "delta", session=d.sess)
                saved = True
            elif op[0] == "restore" and saved:
                for i, d in enumerate(pair.both):
                    src = managers[i] if op[1] == "own" else managers[1 - i]
                    TableCheckpointManager(src.directory, [d.table]).restore(session=d.sess)
            elif op[0] == "swap":
                pair.swap(tmp_path)
            pair.assert_same()
        probe = np.arange(-3, 41, dtype=np.int64)
        np.testing.assert_array_equal(pair.tier.read(probe), pair.mem.read(probe))
        return pair.stats()
    finally:
        pair.close()


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(_op, min_size=1, max_size=25))
@pytest.mark.parametrize("kernels", PATHS)
def test_tiered_table_exports_what_an_in_memory_table_does_after_every_operation(
    tmp_path_factory, kernels, ops
):
    _registry.clear()
    _run(tmp_path_factory.mktemp("tier"), "eager", kernels, ops)


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(_op, min_size=1, max_size=20))
@pytest.mark.parametrize("mode", ["function", "graph"])
def test_tiered_table_agrees_in_tf_function_and_v1_graphs(tmp_path_factory, mode, ops):
    _registry.clear()
    _run(tmp_path_factory.mktemp("tier"), mode, HAVE_CXX, ops)


@pytest.mark.skipif(not HAVE_CXX, reason="no compiler")
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(
        st.lists(st.integers(-3, 30), min_size=1, max_size=16), min_size=1, max_size=10
    ),
    access=st.integers(0, 2),
)
def test_lookups_on_the_clock_train_as_an_in_memory_table(tmp_path_factory, batches, access):
    """Ids without timestamps (one time for the batch): the kernel path's training lookup
    takes the probe's unique keys and the rows it found, probing only the promoted and new
    keys again. Rows, slots and counts equal an in-memory table's (last-seen is the clock)."""
    ssd = str(tmp_path_factory.mktemp("clock"))
    exports = []
    for tier in ({}, {"memory_rows": 3, "ssd_path": ssd}):
        _registry.clear()
        with _build.forced(True):
            table = npu_rec.create_table(
                "clock",
                DIM,
                optimizer=npu_rec.optimizers.Adagrad(0.1),
                access_threshold=access,
                dynamic_expansion=True,
                capacity=4,
                **tier,
            )
        for ids in batches:  # repeats within a batch merge their sightings and gradients
            with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
                emb = npu_rec.sparse_lookup(table, tf.constant(ids, tf.int64))
                loss = tf.reduce_sum(emb * emb) + tf.reduce_sum(emb)
            npu_rec.apply_recorded_gradients(
                recs, tape.gradient(loss, [r.embeddings for r in recs])
            )
        exports.append(table.export())
        if tier:
            table.shards[0].state.store.close()
    want, got = exports
    np.testing.assert_array_equal(got["keys"], want["keys"])
    np.testing.assert_array_equal(got["counts"], want["counts"])
    assert_same_bits(got["values"], want["values"], "values")
    assert_same_bits(got["slots"]["accumulator"], want["slots"]["accumulator"], "accumulator")


def _busy_ops(steps=30, keys=40, seed=0):
    """`steps` training steps of up to 9 of `keys` keys; from 14 steps on, a full and a
    delta save, an eviction and a restore of the other table's checkpoint among them."""
    rng = np.random.default_rng(seed)
    ops = []
    for i in range(steps):
        ids = rng.choice(keys, size=int(rng.integers(1, 10)), replace=False).tolist()
        ops.append(("train", ids, 1))
        if i % 7 == 6:
            ops.append(("save", "delta" if i % 2 else "full"))
        if i % 11 == 10:
            ops.append(("evict", 2))
        if i % 13 == 12:
            ops.append(("restore", "other"))
    return ops


@pytest.mark.parametrize(
    "optimizer,access,shards",
    [("sgd", 0, 1), ("adam", 2, 1), ("ftrl", 0, 2), ("adagrad", 3, 2)],
)
def test_every_optimizer_admission_and_sharding(tmp_path, optimizer, access, shards):
    stats = _run(
        tmp_path,
        "eager",
        HAVE_CXX,
        _busy_ops(steps=20),
        optimizer=optimizer,
        access=access,
        shards=shards,
    )
    assert stats["promotions"] > 0 and stats["demotions"] > 0


@pytest.mark.parametrize(
    "value_dtype,optimizer,shards",
    [
        ("bfloat16", "adagrad", 1),
        ("float16", "adam", 2),
        ("bfloat16", "rowwise_adagrad", 2),
        ("float16", "rowwise_adagrad", 1),
        ("float32", "rowwise_adagrad", 1),
    ],
)
def test_compact_rows_and_row_wise_slots_keep_their_bits_through_the_disk_tier(
    tmp_path, value_dtype, optimizer, shards
):
    ops = [*_busy_ops(steps=20), ("swap", 0), *_busy_ops(steps=8, seed=1)]
    stats = _run(
        tmp_path,
        "eager",
        HAVE_CXX,
        ops,
        optimizer=optimizer,
        shards=shards,
        value_dtype=value_dtype,
    )
    assert stats["promotions"] > 0 and stats["demotions"] > 0


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_compact_rows_through_the_disk_tier_in_tf_function_and_v1_graphs(tmp_path, mode):
    _run(
        tmp_path,
        mode,
        HAVE_CXX,
        _busy_ops(steps=20),
        optimizer="rowwise_adagrad",
        value_dtype="bfloat16",
    )


def _bf16_table(name, optimizer=None, value_dtype="bfloat16", **kwargs):
    return npu_rec.create_table(
        name,
        DIM,
        optimizer=optimizer or npu_rec.optimizers.RowWiseAdagrad(0.1),
        access_threshold=0,
        dynamic_expansion=True,
        value_dtype=value_dtype,
        **kwargs,
    )


def _train_some(table, steps=12, seed=3):
    rng = np.random.default_rng(seed)
    for i in range(steps):
        ids = tf.constant(rng.choice(30, size=5, replace=False), tf.int64)
        npu_rec.sparse_lookup(table, ids, timestamps=tf.fill([5], tf.constant(100 + i, tf.int64)))
        table.apply_gradients(ids, tf.constant(rng.normal(size=(5, DIM)), tf.float32))


def test_a_tiered_bfloat16_checkpoint_restores_into_an_in_memory_table_and_back(tmp_path):
    tiered = _bf16_table("rt", memory_rows=4, ssd_path=str(tmp_path / "ssd"))
    _train_some(tiered)
    assert tiered.tier_stats()["cold_keys"] > 10
    want = tiered.export()
    assert want["values"].dtype == tf.bfloat16.as_numpy_dtype
    assert want["slots"]["accumulator"].shape == (len(want["keys"]), 1)
    tiered.save(str(tmp_path / "tiered.nrc"))
    _registry.clear()
    plain = _bf16_table("rt")
    plain.restore(str(tmp_path / "tiered.nrc"))
    got = plain.export()
    for k in ("keys", "counts", "last_seen"):
        np.testing.assert_array_equal(got[k], want[k])
    assert_same_bits(got["values"], want["values"], "values")
    assert_same_bits(got["slots"]["accumulator"], want["slots"]["accumulator"], "accumulator")
    # And back: the in-memory table's checkpoint into a fresh tiered table.
    plain.save(str(tmp_path / "plain.nrc"))
    _registry.clear()
    again = _bf16_table("rt", memory_rows=4, ssd_path=str(tmp_path / "ssd2"))
    again.restore(str(tmp_path / "plain.nrc"))
    assert again.tier_stats()["cold_keys"] == len(want["keys"]) - 4
    back = again.export()
    assert_same_bits(back["values"], want["values"], "values")
    assert_same_bits(back["slots"]["accumulator"], want["slots"]["accumulator"], "accumulator")
    # Inference reads cold rows from disk: the stored bits, widened to float32.
    emb = npu_rec.sparse_lookup(again, tf.constant(want["keys"]), is_training=False)
    np.testing.assert_array_equal(emb.numpy(), want["values"].astype(np.float32))


def test_a_float32_checkpoint_restores_into_a_tiered_bfloat16_table_as_into_an_in_memory_one(
    tmp_path,
):
    wide = _bf16_table("w", optimizer=npu_rec.optimizers.Adagrad(0.1), value_dtype="float32")
    _train_some(wide)
    wide.save(str(tmp_path / "wide.nrc"))
    _registry.clear()
    plain = _bf16_table("w", optimizer=npu_rec.optimizers.Adagrad(0.1))
    plain.restore(str(tmp_path / "wide.nrc"))
    _registry.clear()
    tiered = _bf16_table(
        "w", optimizer=npu_rec.optimizers.Adagrad(0.1), memory_rows=3, ssd_path=str(tmp_path)
    )
    tiered.restore(str(tmp_path / "wide.nrc"))
    want, got = plain.export(), tiered.export()
    np.testing.assert_array_equal(got["keys"], want["keys"])
    assert_same_bits(got["values"], want["values"], "values")  # rounded to nearest, both
    assert_same_bits(got["slots"]["accumulator"], want["slots"]["accumulator"], "accumulator")


def test_stats_count_hits_promotions_and_bytes(tmp_path):
    stats = _run(tmp_path, "eager", HAVE_CXX, _busy_ops(steps=40))
    assert stats["compactions"] > 0
    assert 0 < stats["hits"] < stats["lookups"]
    assert stats["hit_rate"] == pytest.approx(stats["hits"] / stats["lookups"])
    assert stats["steps"] >= 20
    record = _tier_store.record_dtype(DIM, np.float32, [DIM], np.float32).itemsize
    assert stats["bytes_read"] >= stats["promotions"] * record  # and inference reads
    assert stats["bytes_written"] >= stats["demotions"] * record
    assert stats["disk_bytes"] >= stats["cold_keys"] * record


def _tiered(tmp_path, name="c", memory_rows=2):
    return npu_rec.create_table(
        name,
        DIM,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=0,
        dynamic_expansion=True,
        memory_rows=memory_rows,
        ssd_path=[str(tmp_path / "a"), str(tmp_path / "b")],
    )


def test_a_corrupted_segment_is_refused_by_name(tmp_path):
    table = _tiered(tmp_path)
    manager = TableCheckpointManager(str(tmp_path / "ckpt"), [table])
    for i in range(6):
        npu_rec.sparse_lookup(table, tf.constant([2 * i, 2 * i + 1], tf.int64))
    manager.save(1)
    store = table.state.store
    files = sorted(
        os.path.join(d, f) for d in store.dirs for f in os.listdir(d) if f.endswith(".npr")
    )
    assert {os.path.dirname(os.path.dirname(f)) for f in files} == {
        str(tmp_path / "a"),
        str(tmp_path / "b"),
    }
    recs, locs = store.live_records()
    seg = int(locs[0]) // store.per_segment
    victim = store.path(seg)
    with open(victim, "r+b") as f:  # flip one bit of the first record's row
        f.seek((int(locs[0]) % store.per_segment) * store.dtype.itemsize + 48)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(_tier_store.SegmentCorruptedError, match=os.path.basename(victim)):
        table.export()
    with pytest.raises(Exception, match=os.path.basename(victim)):
        npu_rec.sparse_lookup(table, tf.constant([int(recs["key"][0])], tf.int64))
    try:  # a full save reads the open segment (refused) and links sealed ones unread
        manager.save(2)
    except Exception as err:  # noqa: BLE001
        assert os.path.basename(victim) in str(err)
        assert manager.latest_version() == 1  # the previous version stays the newest
    _registry.clear()
    fresh = npu_rec.create_table(
        "c",
        DIM,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=0,
        dynamic_expansion=True,
    )
    # Every version holding the damaged file (hard-linked) is refused naming it.
    for version in (2, 1)[2 - manager.latest_version() :]:
        folder = _cold.named(os.path.join(manager.directory, f"ckpt-{version:012d}.full.nrc"))
        linked = {os.stat(os.path.join(r, f)).st_ino for r, _, fs in os.walk(folder) for f in fs}
        if os.stat(victim).st_ino in linked:
            with pytest.raises(CheckpointCorruptedError, match=os.path.basename(victim)):
                TableCheckpointManager(manager.directory, [fresh]).restore(version)
        else:
            TableCheckpointManager(manager.directory, [fresh]).restore(version)
            assert fresh.size() == 12


def test_stores_keep_their_own_files_and_remove_those_of_dead_processes(tmp_path):
    dead = tmp_path / "a" / "c.999999999.0"
    dead.mkdir(parents=True)
    (dead / "seg-00000000.npr").write_bytes(b"x")
    table = _tiered(tmp_path)
    assert not dead.exists()
    for i in range(4):
        npu_rec.sparse_lookup(table, tf.constant([2 * i, 2 * i + 1], tf.int64))
    assert table.tier_stats()["cold_keys"] == 6
    with tf.Graph().as_default():  # another table of the name (another graph)
        other = _tiered(tmp_path)
        assert other.state.store.dirs != table.state.store.dirs
    dirs = table.state.store.dirs
    assert any(os.listdir(d) for d in dirs)
    table.state.store.close()
    assert not any(os.path.exists(d) for d in dirs)


def test_memory_rows_bounds_the_rows_kept_between_steps(tmp_path):
    table = _tiered(tmp_path, memory_rows=5)
    for i in range(20):
        npu_rec.sparse_lookup(table, tf.constant([3 * i, 3 * i + 1, 3 * i + 2], tf.int64))
        table.apply_gradients(
            tf.constant([3 * i, 3 * i + 1, 3 * i + 2], tf.int64), tf.ones([3, DIM])
        )
    stats = table.tier_stats()
    assert table.size() == 60
    assert stats["memory_keys"] <= 5 + 3 and stats["cold_keys"] >= 52
    memory = table.memory_stats()
    assert memory["memory_rows"] <= 5 and memory["memory_rows"] + memory["disk_rows"] == 60
    assert memory["live_keys"] == 60
    # A batch larger than memory_rows is held in memory for its step.
    ids = tf.range(100, 112, dtype=tf.int64)
    emb = npu_rec.sparse_lookup(table, ids)
    assert emb.shape == (12, DIM)
    assert table.tier_stats()["memory_keys"] >= 12


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"memory_rows": 4}, "needs both `memory_rows` and `ssd_path`"),
        ({"ssd_path": "x"}, "needs both"),
        ({"memory_rows": 0, "ssd_path": "x"}, "memory_rows=0"),
        ({"memory_rows": True, "ssd_path": "x"}, "memory_rows=True"),
        ({"memory_rows": 4, "ssd_path": []}, r"ssd_path=\[\]"),
        ({"memory_rows": 4, "ssd_path": ["a", "a"]}, "each named once"),
        ({"memory_rows": 4, "ssd_path": 3}, "ssd_path=3"),
    ],
)
def test_bad_tier_arguments_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        npu_rec.create_table("bad", 4, **kwargs)


def test_the_disk_tier_records_take_each_slot_at_its_width_and_rows_in_their_dtype():
    bf16 = tf.bfloat16.as_numpy_dtype
    wide = _tier_store.record_dtype(16, np.float32, [16], np.float32).itemsize
    compact = _tier_store.record_dtype(16, bf16, [1], np.float32).itemsize
    assert wide == 5 * 8 + 16 * 4 + 16 * 4 + 8
    assert compact == 5 * 8 + 16 * 2 + 4 + 4 + 8  # 4 bytes of padding to 8


def test_ssd_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        npu_rec.create_table("bad", 4, memory_rows=2, ssd_path=str(f))


def test_an_optimizer_with_slots_bound_after_creation_is_refused(tmp_path):
    table = npu_rec.create_table(
        "late", DIM, access_threshold=0, memory_rows=2, ssd_path=str(tmp_path)
    )
    with pytest.raises(ValueError, match="pass an optimizer with slots to npu_rec.create_table"):
        table.bind_optimizer(npu_rec.optimizers.Adagrad(0.1))
    table.bind_optimizer(npu_rec.optimizers.SGD(0.1))  # no slots: the records stay the same
    ids = tf.constant([1, 2, 3, 4, 5], tf.int64)
    npu_rec.sparse_lookup(table, ids)
    table.apply_gradients(ids, tf.ones([5, DIM]))
    assert table.size() == 5


def test_tier_stats_of_an_in_memory_table_is_refused():
    table = npu_rec.create_table("plain", DIM)
    with pytest.raises(ValueError, match="not tiered"):
        table.tier_stats()


def test_the_tier_variables_are_table_state_not_dense_model_state(tmp_path):
    """A v1 graph's dense `Saver` leaves out `table.variables()`: the tier's are among them."""

    def outside(**kwargs):
        with tf.Graph().as_default():
            table = npu_rec.create_table(
                "v", DIM, optimizer=npu_rec.optimizers.Adagrad(0.1), access_threshold=0, **kwargs
            )
            left = set(tf.compat.v1.global_variables()) - set(table.variables())
            return sorted(v.name for v in left)

    assert outside(memory_rows=2, ssd_path=str(tmp_path)) == outside()


@pytest.mark.parametrize("kernels", PATHS)
def test_training_and_saves_reach_every_test_only_kill_point(tmp_path, monkeypatch, kernels):
    # Armed at a count never reached: the points are counted, nothing is killed.
    monkeypatch.setenv(_tier_store.KILL_ENV, "save:1000000")
    monkeypatch.setattr(_tier_store, "_KILL_SEEN", dict.fromkeys(_tier_store.KILL_POINTS, 0))
    with _build.forced(kernels):
        table = _tiered(tmp_path)
    manager = TableCheckpointManager(str(tmp_path / "ckpt"), [table])
    for i in range(12):
        npu_rec.sparse_lookup(table, tf.constant([i % 7, (3 * i) % 11], tf.int64))
    manager.save(1)
    assert all(_tier_store._KILL_SEEN[p] > 0 for p in _tier_store.KILL_POINTS), (
        _tier_store._KILL_SEEN
    )


@pytest.mark.parametrize("spec", ["flush:1", "promotion", "promotion:0", "save:x"])
def test_a_malformed_kill_point_is_refused_naming_the_variable(tmp_path, monkeypatch, spec):
    monkeypatch.setenv(_tier_store.KILL_ENV, spec)
    with pytest.raises(npu_rec.ConfigError, match=f"{_tier_store.KILL_ENV}.*{spec}"):
        _tiered(tmp_path)


_KILLED_AT_COMPACTION = """
import sys
import numpy as np
import npu_rec
from npu_rec.checkpoint import TableCheckpointManager

table = npu_rec.create_table(
    "c", 3, optimizer=npu_rec.optimizers.Adagrad(0.1), access_threshold=0,
    dynamic_expansion=True, memory_rows=2, ssd_path=sys.argv[1],
)
manager = TableCheckpointManager(sys.argv[2], [table])
for i in range(40):
    npu_rec.sparse_lookup(table, np.array([i % 7, (3 * i) % 11], np.int64))
    manager.save(i + 1)
print("not killed")
"""


def test_a_process_armed_at_a_point_is_killed_there_and_its_newest_version_restores(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        TF_CPP_MIN_LOG_LEVEL="3",
        NPU_REC_TIER_SEGMENT_BYTES="600",
        **{_tier_store.KILL_ENV: "compaction:2"},
    )
    ssd, ckpt = tmp_path / "ssd", tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_COMPACTION, str(ssd), str(ckpt)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr[-2000:]
    newest = TableCheckpointManager(str(ckpt), []).latest_version()
    assert newest is not None and 1 <= newest < 40
    assert os.listdir(ssd)  # the dead process's segment directory, left behind
    table = _tiered(tmp_path / "restart", memory_rows=2)
    TableCheckpointManager(str(ckpt), [table]).restore()
    assert 0 < int(table.size()) <= 11
    # A store of the table's name in the same directory deletes the dead process's files.
    _registry.clear()
    again = npu_rec.create_table(
        "c",
        DIM,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=0,
        dynamic_expansion=True,
        memory_rows=2,
        ssd_path=str(ssd),
    )
    assert os.listdir(ssd) == [os.path.basename(again.state.store.dirs[0])]


# ------------------------------------------------------------ record locations
def _store(tmp_path, max_locations=None):
    """A store of 8 records per segment (600-byte segments of 72-byte records)."""
    store = _tier_store.SegmentStore(
        [str(tmp_path / "s")],
        "loc",
        DIM,
        np.float32,
        ["acc"],
        np.float32,
        segment_bytes=600,
        max_locations=max_locations,
    )
    assert store.per_segment == 8
    return store


def _recs(store, keys):
    keys = np.asarray(keys, np.int64)
    rows = np.repeat(keys[:, None], DIM, 1).astype(np.float32)
    return store.make_records(keys, rows, rows, keys, keys, keys)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("demote"), st.integers(1, 20)),
            st.tuples(st.just("promote"), st.integers(1, 20)),
            st.tuples(st.just("compact"), st.just(0)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_recycled_segment_numbers_never_alias_a_live_record(tmp_path_factory, ops):
    """A store driven as the tier drives it (read, append, kill, compact, then the
    index follows), against a dict of key -> location: every key's location
    holds its record, and locations stay below the records the segments hold."""
    store = _store(tmp_path_factory.mktemp("alias"))
    index, next_key, peak = {}, 0, 0
    rng = np.random.default_rng(len(ops))
    try:
        for kind, n in ops:
            if kind == "demote":
                keys = np.arange(next_key, next_key + n)
                next_key += n
                index.update(
                    zip(keys.tolist(), store.append(_recs(store, keys)).tolist(), strict=True)
                )
            elif kind == "promote" and index:
                keys = rng.choice(sorted(index), min(n, len(index)), replace=False)
                locs = np.array([index[k] for k in keys], np.int64)
                np.testing.assert_array_equal(store.read(locs)["key"], keys)
                store.kill(locs)
                for k in keys.tolist():
                    del index[k]
            elif kind == "compact":
                seg = store.compaction_candidate()
                if seg >= 0:
                    keys, locs = store.relocate(seg)
                    index.update(zip(keys.tolist(), locs.tolist(), strict=True))
            # The index has followed: every key reads its own record.
            if index:
                keys = np.array(sorted(index), np.int64)
                locs = np.array([index[k] for k in keys.tolist()], np.int64)
                assert len(set(locs.tolist())) == len(locs)
                np.testing.assert_array_equal(store.read(locs)["key"], keys)
            assert store.num_live() == len(index)
            # Numbers are reused: no segment number past the most segments held at
            # once (plus the one a compaction frees before it appends).
            # The segments held, as the tier's next step starts: its first call
            # (`segment_table`) also lets the numbers freed before it be taken again.
            peak = max(peak, len(store.segment_table()[0]))
            assert max(index.values(), default=0) // store.per_segment <= peak
        recs, _ = store.live_records()
        assert sorted(recs["key"].tolist()) == sorted(index)
    finally:
        store.close()


def test_a_freed_segment_number_is_taken_again_only_after_a_read(tmp_path):
    store = _store(tmp_path)
    try:
        first = store.append(_recs(store, range(16)))  # segments 0 and 1 (0 sealed)
        store.append(_recs(store, range(16, 20)))  # segment 2, open
        store.kill(first[:8])  # segment 0 empty: deleted
        assert not os.path.exists(store.path(0))
        more = store.append(_recs(store, range(20, 32)))  # fills 2, opens a new one
        assert (more // 8).max() == 3  # not 0: the index may still point into it
        store.read(more[:1])  # the next step: the index has followed
        again = store.append(_recs(store, range(32, 44)))
        assert 0 in (again // 8).tolist()
        np.testing.assert_array_equal(store.read(again)["key"], np.arange(32, 44))
    finally:
        store.close()


def test_a_shard_at_the_location_limit_refuses_clearly_and_writes_nothing(tmp_path):
    store = _store(tmp_path, max_locations=3 * 8)  # 3 segments
    try:
        locs = store.append(_recs(store, range(20)))
        assert locs.max() < 24
        files = sorted(os.listdir(store.dirs[0]))
        with pytest.raises(ValueError, match=r"'loc'.*below 24.*num_shards"):
            store.append(_recs(store, range(20, 25)))  # 4 fit in segment 2, 1 does not
        assert store.num_live() == 20 and sorted(os.listdir(store.dirs[0])) == files
        store.append(_recs(store, range(20, 24)))  # what fits still does
        store.kill(locs[:8])  # segment 0 freed: its number is taken again
        store.read(locs[8:9])
        again = store.append(_recs(store, range(24, 32)))
        assert again.max() < 24 and set((again // 8).tolist()) == {0}
        np.testing.assert_array_equal(store.read(again)["key"], np.arange(24, 32))
    finally:
        store.close()


def test_a_write_failing_in_its_second_segment_leaves_none_of_its_records_live(
    tmp_path, monkeypatch
):
    """A batch that fills the open segment and fails in the next one (a full disk):
    the records it did write are dead space, the earlier ones read back, and the
    same batch is written once there is room again."""
    store = _store(tmp_path)
    try:
        first = store.append(_recs(store, range(5)))
        real, calls = os.pwrite, []

        def full_disk(fd, data, offset):
            calls.append(offset)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", full_disk)
        with pytest.raises(OSError, match="No space left"):
            store.append(_recs(store, range(5, 12)))  # 3 fit in segment 0, 4 do not
        monkeypatch.setattr(os, "pwrite", real)
        assert len(calls) == 2 and store.num_live() == 5
        recs, _ = store.live_records()
        assert sorted(recs["key"].tolist()) == list(range(5))
        again = store.append(_recs(store, range(5, 12)))
        np.testing.assert_array_equal(store.read(again)["key"], np.arange(5, 12))
        np.testing.assert_array_equal(store.read(first)["key"], np.arange(5))
        assert store.num_live() == 12
    finally:
        store.close()


@pytest.mark.skipif(not HAVE_CXX, reason="no compiler")
def test_a_tiered_kernel_table_past_its_location_limit_names_the_table(tmp_path, monkeypatch):
    """The kernel path's cold index holds 32-bit locations: a shard whose records
    would pass them fails the step with an error naming the table and the remedy,
    never a wrong location."""
    from npu_rec.table import _tier

    monkeypatch.setattr(_tier, "COLD_MAX_LOCATIONS", 4 * 8)
    with _build.forced(True):
        table = _tiered(tmp_path, "lim")
        store = table.state.store
        assert isinstance(table.state.cold_index.map, _key_map.KeyMap)
        assert store.max_locations == 32 and store.per_segment == 8
        with pytest.raises(
            (ValueError, tf.errors.InvalidArgumentError), match=r"'lim'.*num_shards"
        ):
            for i in range(40):
                npu_rec.sparse_lookup(table, tf.constant([2 * i, 2 * i + 1], tf.int64))
        # What the store wrote before is still read back right.
        recs, locs = store.live_records()
        assert locs.max() < 32
        got = table.state.cold_index.lookup(tf.constant(recs["key"])).numpy()
        np.testing.assert_array_equal(got, locs)


@pytest.mark.skipif(not HAVE_CXX, reason="no compiler")
def test_the_kernel_paths_cold_index_takes_at_most_20_bytes_per_cold_key(tmp_path):
    with _build.forced(True):
        table = _tiered(tmp_path, "ram", memory_rows=100)
        ids = np.arange(30_000, dtype=np.int64) * 7919
        for chunk in np.array_split(ids, 10):
            npu_rec.sparse_lookup(table, tf.constant(chunk))
        stats = table.tier_stats()
        assert stats["cold_keys"] + stats["memory_keys"] == 30_000 and stats["cold_keys"] > 20_000
        per_key = stats["cold_index_bytes"] / stats["cold_keys"]
        assert 12 / 0.85 <= per_key <= 12 * 1.4 / 0.85
        assert stats["ram_bytes_per_cold_key"] == pytest.approx(
            (stats["cold_index_bytes"] + stats["cold_liveness_bytes"]) / stats["cold_keys"]
        )
        memory = table.memory_stats()
        assert memory["disk_rows"] == stats["cold_keys"]
