"""Checkpoints of tiered tables: cold records as hard-linked segment files of the version.

A full save keeps the memory rows in the table file and the cold records as
segment files in a directory of the version (sealed segments hard-linked, the
open one's live records copied). Restored into a tiered table (any shard
count), an in-memory table, and from an in-memory checkpoint, the exported
state (keys, rows, slots, counts, last-seen) equals the saved table's; the
version's files are never written after the save; pruning, interrupted saves
and damaged segment files follow the commit rules of the table files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec.checkpoint import CheckpointCorruptedError, TableCheckpointManager, _cold
from npu_rec.checkpoint._training_dir import TrainingDir
from npu_rec.table import _registry, _tier_store
from tests.table.tier_driver import (
    assert_same_bits,
    small_segments,  # noqa: F401 (the fixture, used by `pytestmark`)
)

DIM = 3
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Every test: segment files of a few records (and a fresh table registry).
pytestmark = pytest.mark.usefixtures("small_segments")


def _table(tmp_path, *, memory_rows=3, shards=1, tiered=True, value_dtype="float32"):
    _registry.clear()
    extra = {"memory_rows": memory_rows, "ssd_path": str(tmp_path / "ssd")} if tiered else {}
    return npu_rec.create_table(
        "c",
        DIM,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=0,
        dynamic_expansion=True,
        num_shards=shards,
        value_dtype=value_dtype,
        **extra,
    )


def _train(table, batches, seed=0):
    rng = np.random.default_rng(seed)
    for ids in batches:
        ids = np.asarray(ids, np.int64)
        ts = 100 + rng.integers(0, 50, len(ids))
        grads = tf.constant(rng.normal(size=(len(ids), DIM)).astype(np.float32))
        npu_rec.sparse_lookup(table, tf.constant(ids), timestamps=tf.constant(ts))
        table.apply_gradients(tf.constant(ids), grads)


def _assert_same(got: dict, want: dict) -> None:
    for k in ("keys", "counts", "last_seen"):
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert_same_bits(got["values"], want["values"], "values")
    for n in want["slots"]:
        assert_same_bits(got["slots"][n], want["slots"][n], n)


def _cold_files(ckpt_dir: str) -> dict[str, os.stat_result]:
    out = {}
    for root, _, files in os.walk(ckpt_dir):
        if _cold.MARK in root:
            for f in files:
                out[os.path.join(root, f)] = os.stat(os.path.join(root, f))
    return out


def _digests(paths) -> dict[str, str]:
    return {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


_FIXED = [[i, i + 20, i + 41] for i in range(12)]
_batches = st.lists(
    st.lists(st.integers(0, 60), min_size=1, max_size=8, unique=True), min_size=3, max_size=10
)


@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    before=_batches,
    after=_batches,
    delta=st.booleans(),
    src_shards=st.sampled_from([1, 2]),
    shards=st.sampled_from([1, 2]),
)
# Both ways files go to shards: whole files (same shard count) and filtered by key.
@example(before=_FIXED, after=_FIXED[:4], delta=True, src_shards=2, shards=2)
@example(before=_FIXED, after=_FIXED[:4], delta=False, src_shards=1, shards=2)
def test_a_tiered_save_restores_into_tiered_and_in_memory_tables_and_back(
    tmp_path_factory, before, after, delta, src_shards, shards
):
    tmp = tmp_path_factory.mktemp("cold")
    src = _table(tmp / "src", shards=src_shards)
    manager = TableCheckpointManager(str(tmp / "ckpt"), [src])
    _train(src, before)
    manager.save(1)
    if delta:
        _train(src, after[:3], seed=1)
        manager.save(2, delta=True)
    want = src.export()
    files = _cold_files(str(tmp / "ckpt"))
    digests = _digests(files)

    def other_segments():  # records appended, not whole files copied
        size = _tier_store.DEFAULT_SEGMENT_BYTES
        _tier_store.DEFAULT_SEGMENT_BYTES = 2 * size
        try:
            return _table(tmp / "t4")
        finally:
            _tier_store.DEFAULT_SEGMENT_BYTES = size

    targets = {
        "tiered": lambda: _table(tmp / "t1", shards=shards),
        "tiered, more memory": lambda: _table(tmp / "t2", memory_rows=50),
        "tiered, other segment size": other_segments,
        "in memory": lambda: _table(tmp / "m", tiered=False, shards=shards),
    }
    for what, make in targets.items():
        table = make()
        TableCheckpointManager(str(tmp / "ckpt"), [table]).restore()
        _assert_same(table.export(), want)
        if what == "tiered":  # the restored table trains as the saved one does
            _train(table, after, seed=2)
            restored = table.export()
    _train(src, after, seed=2)
    _assert_same(restored, src.export())
    # Training on restored tables wrote nothing into the version's files.
    assert _digests(files) == digests
    # And back: an in-memory table's checkpoint restores into a tiered one.
    mem = _table(tmp / "m2", tiered=False)
    TableCheckpointManager(str(tmp / "ckpt"), [mem]).restore()
    back = TableCheckpointManager(str(tmp / "ckpt_mem"), [mem])
    back.save(5)
    tiered = _table(tmp / "t3", shards=shards)
    TableCheckpointManager(str(tmp / "ckpt_mem"), [tiered]).restore()
    _assert_same(tiered.export(), want)


def test_a_full_save_hard_links_sealed_segments_and_copies_only_the_open_ones_records(tmp_path):
    table = _table(tmp_path)
    _train(table, [[i, i + 40, i + 80] for i in range(30)])
    store = table.state.store
    manager = TableCheckpointManager(str(tmp_path / "ckpt"), [table])
    path = manager.save(1)
    meta = npu_rec.checkpoint.read_file(path)[1]
    shard = meta["cold"]["c"]["shards"][0]
    linked = [f for f in shard["files"] if f["linked"]]
    assert len(linked) >= 3
    inodes = {os.stat(info["path"]).st_ino for info in store._segments.values()}
    folder = _cold.named(path)
    for f in linked:  # the store's own file, not a copy
        assert os.stat(os.path.join(folder, f["file"])).st_ino in inodes
        assert os.stat(os.path.join(folder, f["file"])).st_nlink >= 2
    # Only the open segment's live records were written.
    assert shard["bytes_copied"] < store.per_segment * store.dtype.itemsize
    assert shard["bytes_copied"] == sum(
        f["records"] * store.dtype.itemsize for f in shard["files"] if not f["linked"]
    )
    # Every live cold key is in the version: its files' live records.
    assert sum(f["live"] for f in shard["files"]) == store.num_live()
    # A second full save links the same files again (no sealed byte rewritten).
    again = manager.save(2)
    folder2 = _cold.named(again)
    meta2 = npu_rec.checkpoint.read_file(again)[1]
    for f in meta2["cold"]["c"]["shards"][0]["files"]:
        if f["linked"]:
            assert (
                os.stat(os.path.join(folder2, f["file"])).st_ino
                == os.stat(os.path.join(folder, f["file"])).st_ino
            )


def test_a_delta_save_reads_only_segments_written_in_its_period(tmp_path, monkeypatch):
    table = _table(tmp_path)
    _train(table, [[i, i + 40] for i in range(25)])
    manager = TableCheckpointManager(str(tmp_path / "ckpt"), [table])
    manager.save(1)
    store = table.state.store
    read = []
    scan = _tier_store.SegmentStore._scan
    monkeypatch.setattr(
        _tier_store.SegmentStore,
        "_scan",
        lambda self, info: read.append(info) or scan(self, info),
    )
    _train(table, [[100, 101], [102, 103]])
    manager.save(2, delta=True)
    written = [i for i in store._segments.values() if i["period"] == store.period - 1]
    assert read and all(i["period"] >= store.period - 1 for i in read)
    assert len(read) <= len(written) + 1 < len(store._segments)


def test_pruning_and_rollback_take_the_cold_directories_with_their_versions(tmp_path):
    table = _table(tmp_path)
    model = tmp_path / "model"
    tdir = TrainingDir(str(model), keep=2).open()
    manager = TableCheckpointManager(str(model / "tables"), [table])
    for step in range(1, 5):
        _train(table, [[step, step + 10, step + 20, step + 30]], seed=step)
        manager.save(
            step, commit=lambda p, s=step: tdir.commit(s, "full", [os.path.relpath(p, model)])
        )
    left = sorted(n for n in os.listdir(model / "tables") if _cold.MARK in n)
    assert [n.split(".")[0] for n in left] == ["ckpt-000000000003", "ckpt-000000000004"]
    version, _ = tdir.log.select()
    first = [v for v in tdir.log.versions() if v.step == 3][0]
    tdir.start_from(first)  # version 4 is moved aside with its directory
    assert [n for n in os.listdir(model / "tables") if _cold.MARK in n] == [left[0]]
    retired = [r for r, _, _ in os.walk(model / "retired") if _cold.MARK in r]
    assert retired and version.step == 4
    tdir.close()


_KILLED_IN_SAVE = """
import os, sys
import numpy as np
import npu_rec
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.checkpoint._training_dir import TrainingDir

table = npu_rec.create_table(
    "c", 3, optimizer=npu_rec.optimizers.Adagrad(0.1), access_threshold=0,
    dynamic_expansion=True, memory_rows=2, ssd_path=sys.argv[1],
)
model = sys.argv[2]
tdir = TrainingDir(model).open()
manager = TableCheckpointManager(os.path.join(model, "tables"), [table])
for i in range(40):
    npu_rec.sparse_lookup(table, np.array([i % 13, (3 * i) % 17, 50 + i], np.int64))
    manager.save(i + 1, commit=lambda p, s=i + 1: tdir.commit(s, "full", [os.path.relpath(p, model)]))
print("not killed")
"""


def test_a_kill_inside_a_save_leaves_the_previous_version_newest_and_is_cleaned_up(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        TF_CPP_MIN_LOG_LEVEL="3",
        NPU_REC_TIER_SEGMENT_BYTES="600",
        **{_tier_store.KILL_ENV: "save:6"},
    )
    model = tmp_path / "model"
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_SAVE, str(tmp_path / "ssd"), str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr[-2000:]
    leftovers = [n for n in os.listdir(model / "tables") if ".tmp-" in n]
    assert leftovers  # the interrupted save's directory, some files linked
    tdir = TrainingDir(str(model)).open()
    version, _ = tdir.log.select()
    assert version.step == 5
    names = os.listdir(model / "tables")
    assert not [n for n in names if ".tmp-" in n]
    assert sorted(n for n in names if _cold.MARK in n) == sorted(
        os.path.basename(_cold.named(str(model / "tables" / n)))
        for n in names
        if n.endswith(".nrc")
    )
    # A directory published but whose table file was never written is removed too.
    os.makedirs(model / "tables" / "ckpt-000000000009.full.cold-0123456789ab" / "c" / "0")
    tdir.close()
    TrainingDir(str(model)).open().close()
    assert not (model / "tables" / "ckpt-000000000009.full.cold-0123456789ab").exists()
    table = _table(tmp_path / "restart", memory_rows=2)
    TableCheckpointManager(str(model / "tables"), [table]).restore(version=5)
    assert int(table.size()) > 0


def test_a_damaged_linked_segment_refuses_its_version_by_name_and_falls_back(tmp_path, caplog):
    table = _table(tmp_path)
    model = tmp_path / "model"
    tdir = TrainingDir(str(model)).open()
    manager = TableCheckpointManager(str(model / "tables"), [table])

    def save(step):
        return manager.save(
            step, commit=lambda p: tdir.commit(step, "full", [os.path.relpath(p, model)])
        )

    _train(table, [[i, i + 40] for i in range(12)])
    first = save(1)
    want = table.export()
    _train(table, [[i + 100, i + 140] for i in range(12)], seed=1)
    second = save(2)
    old = {os.stat(p).st_ino for p in _cold_files(_cold.named(first))}
    victim = next(
        p
        for p in sorted(_cold_files(_cold.named(second)))
        if os.stat(p).st_ino not in old and os.path.getsize(p) > 100
    )
    with open(victim, "r+b") as f:  # one bit of the first record's row
        f.seek(48)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CheckpointCorruptedError, match=os.path.basename(victim)):
        tdir.log.select(fallback=False)
    with caplog.at_level(logging.WARNING):
        version, chain = tdir.log.select()
    assert version.step == 1
    assert os.path.basename(victim) in caplog.text
    with pytest.raises(CheckpointCorruptedError, match=os.path.basename(victim)):
        TableCheckpointManager(str(model / "tables"), [_table(tmp_path / "x")]).restore(2)
    fresh = _table(tmp_path / "restart")
    TableCheckpointManager(str(model / "tables"), [fresh]).restore(version=1)
    _assert_same(fresh.export(), want)
    tdir.close()


def test_an_old_tiered_checkpoint_with_every_row_in_the_file_still_restores(tmp_path):
    table = _table(tmp_path)
    _train(table, [[i, i + 40] for i in range(12)])
    path = str(tmp_path / "single.nrc")
    table.save(path)  # `SparseTable.save`: both tiers in the one file, as before
    assert "cold" not in npu_rec.checkpoint.read_file(path)[1]
    want = table.export()
    for tiered in (True, False):
        other = _table(tmp_path / f"o{tiered}", tiered=tiered)
        other.restore(path)
        _assert_same(other.export(), want)


def test_inspect_counts_the_cold_keys_of_a_tiered_version(tmp_path):
    from npu_rec.scripts import _checkpoints

    table = _table(tmp_path)
    _train(table, [[i, i + 40] for i in range(12)])
    model = tmp_path / "model"
    tdir = TrainingDir(str(model)).open()
    manager = TableCheckpointManager(str(model / "tables"), [table])
    manager.save(1, commit=lambda p: tdir.commit(1, "full", [os.path.relpath(p, model)]))
    assert _checkpoints.table_sizes(str(model)) == {"c": int(table.size())}
    _train(table, [[7, 200]], seed=3)
    manager.save(
        2, delta=True, commit=lambda p: tdir.commit(2, "delta", [os.path.relpath(p, model)])
    )
    assert _checkpoints.table_sizes(str(model)) == {"c": int(table.size())}
    json.dumps(_checkpoints.table_sizes(str(model)))
    tdir.close()


def test_segments_are_copied_where_a_hard_link_fails(tmp_path, monkeypatch):
    table = _table(tmp_path)
    _train(table, [[i, i + 40, i + 80] for i in range(20)])
    want = table.export()

    def no_link(src, dst):  # as across filesystems
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(_tier_store.os, "link", no_link)
    path = TableCheckpointManager(str(tmp_path / "ckpt"), [table]).save(1)
    shard = npu_rec.checkpoint.read_file(path)[1]["cold"]["c"]["shards"][0]
    files = _cold_files(str(tmp_path / "ckpt"))
    assert files and all(s.st_nlink == 1 for s in files.values())
    assert shard["bytes_copied"] == sum(s.st_size for s in files.values())
    other = _table(tmp_path / "other")
    TableCheckpointManager(str(tmp_path / "ckpt"), [other]).restore()
    _assert_same(other.export(), want)
