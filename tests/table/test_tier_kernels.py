"""The tiered table's disk-tier kernels (`tier_io.cc`) against the NumPy store they stand in for.

On the kernel path a tiered table reads its cold records with `pread`,
chooses its victims, packs their records and verifies and unpacks the
records it reads in kernels; the NumPy path (`SegmentStore.make_records`,
`read`, `_tier.select_victims`) is the reference: the same bytes on disk,
the same bytes and fields read back, the same victims, and a corrupted
record refused naming its segment file.
"""

from __future__ import annotations

import os
import shutil

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build, _ops
from npu_rec._kernels._key_map import KeyMap
from npu_rec.table import _key_index, _registry, _storage, _tier, _tier_store

HAVE_CXX = shutil.which(os.environ.get("CXX") or "g++") is not None
pytestmark = pytest.mark.skipif(not HAVE_CXX, reason="no compiler: the kernels do not build")

_ROW_DTYPES = {
    "float32": (np.float32, tf.float32),
    "bfloat16": (ml_dtypes.bfloat16, tf.bfloat16),
    "float16": (np.float16, tf.float16),
}


@pytest.fixture(scope="module")
def lib():
    with _build.forced(True):
        return _build.library()


def _store(tmp_path, dim, row_np, widths, **kwargs):
    names = [f"s{i}" for i in range(len(widths))]
    return _tier_store.SegmentStore(
        [str(tmp_path)], "t", dim, row_np, names, np.float32, slot_widths=widths, **kwargs
    )


def _read(lib, store, locs):
    """(words int64 [m, words] read by `NpuRecTierRead`, segment index of each, paths)."""
    segs, fds, paths = store.segment_table()
    locs = np.asarray(locs, np.int64)
    words = lib.npu_rec_tier_read(
        locations=tf.constant(locs),
        segments=tf.constant(segs),
        fds=tf.constant(fds),
        paths=tf.constant(list(paths), tf.string),
        dirs=tf.constant(store.dirs, tf.string),
        words=store.words,
        per_segment=store.per_segment,
        table=store.name,
    ).numpy()
    return words, np.searchsorted(segs, locs // store.per_segment), list(paths)


def _rows(rng, n, dim, row_np, widths, meta):
    """Variables of `n` rows (as a table holds them) and the same columns in NumPy."""
    cols = {
        "keys": rng.integers(-(2**62), 2**62, n),
        "values": rng.normal(size=(n, dim)).astype(row_np),
        "counts": rng.integers(0, 1000, n).astype(meta),
        "saved": rng.integers(0, 1000, n).astype(meta),
        "seen": rng.integers(0, 2**30, n).astype(meta),
        "slots": [rng.normal(size=(n, w)).astype(np.float32) for w in widths],
    }
    tf_row = {np.dtype(v[0]): v[1] for v in _ROW_DTYPES.values()}[np.dtype(row_np)]
    variables = {
        "row_keys": tf.Variable(cols["keys"]),
        "values": tf.Variable(tf.constant(cols["values"], tf_row)),
        "counts": tf.Variable(cols["counts"]),
        "saved_counts": tf.Variable(cols["saved"]),
        "last_seen": tf.Variable(cols["seen"]),
        "slots": [tf.Variable(s) for s in cols["slots"]],
    }
    return variables, cols, tf_row


def _absolute(seen: np.ndarray) -> np.ndarray:
    """int64 absolute times of a last-seen column (an int32 column holds them less SEEN_BASE)."""
    return seen.astype(np.int64) + (_storage.SEEN_BASE if seen.dtype == np.int32 else 0)


def _pack(lib, v, rows, period, store):
    return lib.npu_rec_tier_pack(
        row_keys=v["row_keys"].handle,
        values=v["values"].handle,
        counts=v["counts"].handle,
        saved_counts=v["saved_counts"].handle,
        last_seen=v["last_seen"].handle,
        slots=[s.handle for s in v["slots"]],
        rows=tf.constant(rows, tf.int64),
        period=tf.constant(period, tf.int64),
        weights=tf.constant(store.weights),
        dim=store.dim,
        slot_widths=store.slot_widths,
    ).numpy()


def _unpack(lib, words, store, row_tf, period, paths=(b"seg",), which=None):
    which = np.zeros(len(words), np.int64) if which is None else which
    return lib.npu_rec_tier_unpack(
        records=tf.constant(words, tf.int64),
        weights=tf.constant(store.weights),
        segment_of=tf.constant(which, tf.int64),
        paths=tf.constant(list(paths), tf.string),
        period=tf.constant(period, tf.int64),
        T=row_tf,
        S=tf.float32,
        dim=store.dim,
        slot_width=sum(store.slot_widths),
        table=store.name,
    )


_layouts = st.tuples(
    st.integers(1, 9),  # dim
    st.sampled_from(sorted(_ROW_DTYPES)),
    st.sampled_from([(), ("dim",), ("dim", "dim"), ("one",), ("one", "dim")]),
    st.sampled_from([np.int64, np.int32]),  # the table's count / last-seen columns
    st.integers(0, 30),  # rows packed
    st.integers(0, 3),  # period
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layout=_layouts, seed=st.integers(0, 2**31 - 1))
def test_packed_records_are_the_numpy_stores_bytes_and_unpack_to_what_it_reads(
    lib, tmp_path_factory, layout, seed
):
    dim, row_name, kinds, meta, k, period = layout
    row_np, _ = _ROW_DTYPES[row_name]
    widths = [dim if kind == "dim" else 1 for kind in kinds]
    rng = np.random.default_rng(seed)
    store = _store(tmp_path_factory.mktemp("pack"), dim, row_np, widths)
    try:
        store.period = period
        v, cols, row_tf = _rows(rng, 40, dim, row_np, widths, meta)
        rows = rng.choice(40, size=k, replace=False)
        words = _pack(lib, v, rows, period, store)
        slots = np.concatenate([s[rows] for s in cols["slots"]], 1) if widths else None
        want = store.make_records(
            cols["keys"][rows],
            cols["values"][rows],
            slots,
            cols["counts"][rows].astype(np.int64),
            cols["saved"][rows].astype(np.int64),
            _absolute(cols["seen"][rows]),
        )
        assert words.shape == (k, store.words)
        np.testing.assert_array_equal(
            words.view(np.uint8).reshape(-1), want.view(np.uint8).reshape(-1)
        )

        # Written by the store, read back as a later period: the kernel's fields are
        # the NumPy read's, bit for bit.
        locs = store.append(words)
        store.period = period + int(rng.integers(0, 2))
        got_words, which, paths = _read(lib, store, locs)
        recs = store.read(locs)
        values, slots_out, counts, saved, seen = _unpack(
            lib, got_words, store, row_tf, store.period, paths, which
        )
        np.testing.assert_array_equal(
            values.numpy().view(np.uint8), np.ascontiguousarray(recs["row"]).view(np.uint8)
        )
        want_slots = recs["slots"] if widths else np.zeros((k, 0), np.float32)
        np.testing.assert_array_equal(
            slots_out.numpy().view(np.uint8), np.ascontiguousarray(want_slots).view(np.uint8)
        )
        np.testing.assert_array_equal(counts.numpy(), recs["count"])
        np.testing.assert_array_equal(saved.numpy(), store.saved_counts(recs))
        np.testing.assert_array_equal(seen.numpy(), recs["last_seen"])
        assert which.shape == (k,)
    finally:
        store.close()


def _victims(lib, counts, seen, held, n, k, hand=0):
    victims, nxt = lib.npu_rec_tier_victims(
        counts=tf.Variable(counts).handle,
        last_seen=tf.Variable(seen).handle,
        held_rows=tf.constant(held, tf.int64),
        num_rows=tf.constant(n, tf.int64),
        k=tf.constant(k, tf.int64),
        hand=tf.constant(hand, tf.int64),
    )
    return victims.numpy(), int(nxt)


def _scores(counts, seen, held, n):
    eligible = (counts[:n] > 0) & ~np.isin(np.arange(n), held)
    c = counts[:n].astype(np.float64)
    score = np.where(
        eligible, _absolute(seen[:n]).astype(np.float64) + 1.0 - 1.0 / (1.0 + c), np.inf
    )
    return eligible, score


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 60),
    k=st.integers(0, 70),
    meta=st.sampled_from([np.int64, np.int32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_victims_of_a_small_table_are_the_lowest_scores_as_the_numpy_path_chooses(
    lib, n, k, meta, seed
):
    rng = np.random.default_rng(seed)
    cap = n + 5
    counts = rng.integers(0, 4, cap).astype(meta)  # count 0: a released row, never a victim
    seen = rng.integers(0, 6, cap).astype(meta)  # few values: many ties
    held = rng.choice(cap, size=min(cap, int(rng.integers(0, 8))), replace=False)
    held = np.concatenate([held, [-1]]).astype(np.int64)  # a key without a row: -1
    hand = int(rng.integers(0, n + 3))
    victims, nxt = _victims(lib, counts, seen, held, n, k, hand)
    want, want_next = _tier.select_victims(counts[:n], _absolute(seen[:n]), held, k, hand)
    np.testing.assert_array_equal(victims, want)  # the same rows (ties: the lower row)
    assert nxt == want_next
    eligible, score = _scores(counts, seen, held, n)
    take = min(k, int(eligible.sum()))
    assert len(victims) == take and len(set(victims.tolist())) == take
    assert np.all(np.diff(victims) > 0)  # in row order
    assert eligible[victims].all()
    np.testing.assert_array_equal(np.sort(score[victims]), np.sort(score)[:take])


@pytest.mark.parametrize("case", ["spread", "ties", "sampled_rows_lowest"])
@pytest.mark.parametrize("k", [1, 700, 10000, 30000])
@pytest.mark.parametrize("meta", [np.int64, np.int32])
def test_victims_of_a_large_table_are_old_rows_from_the_hand_as_the_numpy_path_chooses(
    lib, case, k, meta
):
    """Past 16k rows, a hand scans for rows under a sampled bound; the NumPy path agrees."""
    n = 60000
    rng = np.random.default_rng(k)
    counts = rng.integers(0, 5, n).astype(meta)
    seen = (rng.integers(0, 10**6, n) if case != "ties" else rng.integers(0, 3, n)).astype(meta)
    if case == "sampled_rows_lowest":  # the sample reads the lowest: too few pass the bound
        seen[:: n // 4096] = 0
        counts[:: n // 4096] = 1
    held = rng.choice(n, size=500, replace=False)
    eligible, score = _scores(counts, seen, held, n)
    take = min(k, int(eligible.sum()))
    hand, seen_rows = int(rng.integers(0, n)), []
    for _ in range(3):  # successive selections, the hand carried over
        victims, nxt = _victims(lib, counts, seen, held, n, k, hand)
        want, want_next = _tier.select_victims(counts, _absolute(seen), held, k, hand)
        np.testing.assert_array_equal(victims, want)
        assert nxt == want_next
        assert len(victims) == take and len(np.unique(victims)) == take
        assert eligible[victims].all() and np.all(np.diff(victims) > 0)
        if case == "spread" and 2 * _tier._SPREAD * k < n:
            # Old rows: the victims are among the oldest ~_SPREAD * k rows (well under
            # 3x that, for the sample's error), and the hand moved on past them.
            assert np.sum(score < score[victims].max()) < 3 * _tier._SPREAD * k + 64 * (n // 4096)
            assert nxt != hand
            seen_rows.append(victims)
        elif case != "ties" and k > n // 8:  # many victims: the exact lowest scores
            np.testing.assert_array_equal(np.sort(score[victims]), np.sort(score)[:take])
        hand = nxt
    if seen_rows:  # the hand's steps took different rows
        assert len(np.unique(np.concatenate(seen_rows))) == 3 * take


def test_a_record_failing_its_checksum_is_refused_naming_its_file(lib, tmp_path):
    store = _store(tmp_path, 4, np.float32, [4])
    try:
        v, _, row_tf = _rows(np.random.default_rng(0), 6, 4, np.float32, [4], np.int64)
        words = _pack(lib, v, np.arange(6), 0, store)
        locs = store.append(words)
        got, which, paths = _read(lib, store, locs)
        for word in range(store.words):  # any bit of any word, the checksum's included
            bad = got.copy()
            bad[3, word] ^= 1 << 40
            with pytest.raises(tf.errors.DataLossError) as err:
                _unpack(lib, bad, store, row_tf, 0, paths, which)
            message = str(err.value)
            assert "SegmentCorruptedError" in message
            assert os.path.basename(paths[0].decode()) in message
            assert "1 records fail their checksum" in message
        _unpack(lib, got, store, row_tf, 0, paths, which)  # intact: reads
    finally:
        store.close()


def test_a_corrupted_segment_fails_a_kernel_path_lookup_naming_it_and_changes_nothing(tmp_path):
    _registry.clear()
    with _build.forced(True):
        table = npu_rec.create_table(
            "c",
            3,
            optimizer=npu_rec.optimizers.Adagrad(0.1),
            access_threshold=0,
            dynamic_expansion=True,
            memory_rows=4,
            ssd_path=str(tmp_path / "ssd"),
        )
    assert table.backend.name == "kernels+tier"
    for i in range(6):
        npu_rec.sparse_lookup(table, tf.constant([2 * i, 2 * i + 1], tf.int64))
    store = table.state.store
    recs, locs = store.live_records()
    victim = store.path(int(locs[0]) // store.per_segment)
    with open(victim, "r+b") as f:  # flip one bit of the first cold record's row
        f.seek((int(locs[0]) % store.per_segment) * store.dtype.itemsize + 48)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    hot_before = table.state.index.export()[0].numpy()
    size_before = int(table.size())
    with pytest.raises(tf.errors.DataLossError, match=os.path.basename(victim)) as err:
        npu_rec.sparse_lookup(table, tf.constant([int(recs["key"][0]), 100], tf.int64))
    assert "SegmentCorruptedError" in str(err.value)
    # Refused before anything moved: the same keys in memory, on disk, in all.
    np.testing.assert_array_equal(
        np.sort(table.state.index.export()[0].numpy()), np.sort(hot_before)
    )
    assert int(table.size()) == size_before and store.num_live() == len(recs)
    with pytest.raises(_tier_store.SegmentCorruptedError, match=os.path.basename(victim)):
        table.export()
    _registry.clear()


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**31 - 1), m=st.sampled_from([0, 1, 7, 300, 3000]))
def test_pread_reads_the_bytes_the_numpy_path_reads_across_segments(lib, tmp_path_factory, seed, m):
    """Random locations over 20 segments (neighbours, far apart, repeated): the same words."""
    rng = np.random.default_rng(seed)
    store = _store(tmp_path_factory.mktemp("read"), 4, np.float32, [4, 1], segment_bytes=1 << 16)
    try:
        v, _, _ = _rows(rng, 50, 4, np.float32, [4, 1], np.int64)
        locs = np.concatenate(
            [store.append(_pack(lib, v, rng.integers(0, 50, 700), 0, store)) for _ in range(20)]
        )
        assert len(store.segment_table()[0]) > 10
        want = rng.choice(locs, size=m)  # with repeats
        got, which, paths = _read(lib, store, want)
        expect = store.read(want).view(np.int64).reshape(m, store.words)
        np.testing.assert_array_equal(got, expect)
        segs = want // store.per_segment
        assert [paths[i].decode() for i in which] == [store.path(int(g)) for g in segs]
    finally:
        store.close()


def test_pread_refuses_a_corrupted_missing_or_short_segment_naming_its_file(lib, tmp_path):
    store = _store(tmp_path, 4, np.float32, [4], segment_bytes=1 << 12)
    try:
        v, _, row_tf = _rows(np.random.default_rng(1), 40, 4, np.float32, [4], np.int64)
        locs = store.append(_pack(lib, v, np.arange(40), 0, store))
        segs = locs // store.per_segment
        middle = int(segs[len(segs) // 2])
        damaged = store.path(middle)
        at = int(np.nonzero(segs == middle)[0][1])
        with open(damaged, "r+b") as f:  # one bit of one record's row
            f.seek(int(locs[at] % store.per_segment) * store.dtype.itemsize + 44)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 4]))
        got, which, paths = _read(lib, store, locs)
        with pytest.raises(tf.errors.DataLossError) as err:
            _unpack(lib, got, store, row_tf, 0, paths, which)
        assert "SegmentCorruptedError" in str(err.value) and damaged in str(err.value)
        with pytest.raises(_tier_store.SegmentCorruptedError, match=os.path.basename(damaged)):
            store.read(locs)  # the NumPy path refuses it too

        gone = (int(segs[-1]) + 5) * store.per_segment  # a segment with no file
        with pytest.raises(tf.errors.DataLossError, match="missing") as err:
            _read(lib, store, [int(locs[0]), gone])
        assert store.path(int(segs[-1]) + 5) in str(err.value)

        last = store.path(int(segs[-1]))
        os.truncate(last, 0)  # the file cut short under the store
        with pytest.raises(tf.errors.DataLossError, match="cannot be read") as err:
            _read(lib, store, locs[segs == segs[-1]])
        assert last in str(err.value)
    finally:
        store.close()


@settings(max_examples=25, deadline=None)
@given(
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200)
    | st.lists(st.integers(-20, 20), max_size=300)
    | st.lists(st.sampled_from([*_key_index.RESERVED_RAW_KEYS, -(2**63), 0, 7]), max_size=20),
    held=st.integers(0, 3),
    cold=st.integers(0, 3),
    own_map=st.booleans(),
)
def test_the_probe_is_tf_unique_with_counts_and_both_indexes_lookups(lib, ids, held, cold, own_map):
    """The batch's keys (`tf.unique_with_counts`: first sightings first), their rows as
    `KeyIndex.lookup` finds them, and the cold ones the fused tiered lookup promotes with
    their locations, reserved raw ids included."""
    x = tf.constant(np.array(ids, np.int64).reshape(-1), tf.int64)
    want = tf.unique(x)[0]
    index, cold_index = (
        _key_index.KeyIndex(
            64, map_class=KeyMap if own_map else tf.lookup.experimental.DenseHashTable
        )
        for _ in range(2)
    )
    keep = want[:: held + 1] if held else want[:0]  # every other, third, ... key held
    index.insert(keep, tf.range(tf.size(keep, out_type=tf.int64)) * 3 + 1)
    rest = tf.boolean_mask(want, index.lookup(want) < 0)
    on_disk = rest[:: cold + 1] if cold else rest[:0]
    cold_index.insert(on_disk, tf.range(tf.size(on_disk, out_type=tf.int64)) * 5 + 2)
    got = _ops.tier_probe(index, cold_index, x)
    np.testing.assert_array_equal(got[0].numpy(), want.numpy())
    rows = index.lookup(want).numpy()
    np.testing.assert_array_equal(got[1].numpy(), rows)
    _, at, counts = tf.unique_with_counts(x)
    np.testing.assert_array_equal(got[2].numpy(), at.numpy())
    np.testing.assert_array_equal(got[3].numpy(), counts.numpy())
    assert int(got[4]) == int(np.sum(rows < 0))
    missing = want.numpy()[rows < 0]
    locs = cold_index.lookup(tf.constant(missing, tf.int64)).numpy()
    np.testing.assert_array_equal(got[5].numpy(), missing[locs >= 0])
    np.testing.assert_array_equal(got[6].numpy(), locs[locs >= 0])
