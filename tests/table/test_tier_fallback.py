"""A tiered table with `not_admitted="hashed"` against an in-memory table with the same fallback.

The fallback (the trained rows of keys not admitted yet) is kept beside the key
rows, so a disk tier must not change it: with a tiny `memory_rows` (every step
promotes and demotes), every training lookup, every inference lookup (admitted
keys in memory and on disk, keys still counting, unknown keys), the exported
rows and the fallback's rows, slots and step equal those of an in-memory table
fed the same batches, on the stock and the kernel path, through eviction and restores of each table's checkpoints into the other kind of table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec.distribute._ps import table_placement
from npu_rec.table import _registry
from tests.table.tier_driver import (
    HAVE_CXX,
    PATHS,
    TablePair,
    assert_same_bits,
    small_segments,  # noqa: F401 (the fixture, used by `pytestmark`)
)

DIM = 3
KEYS = 40

#: Every test: segment files of a few records (and a fresh table registry).
pytestmark = pytest.mark.usefixtures("small_segments")


def _same_fallback(pair: TablePair) -> None:
    want, got = (d.table.read_state(session=d.sess) for d in pair.both)
    fields = sorted(k for k in want if k.startswith("fallback/"))
    assert "fallback/values" in fields and "fallback/step" in fields
    assert fields == sorted(k for k in got if k.startswith("fallback/"))
    for k in fields:
        assert_same_bits(np.asarray(got[k]), np.asarray(want[k]), k)


def _run(tmp_path, mode, kernels, ops, *, optimizer="adagrad", shards=1, **extra):
    pair = TablePair(
        mode,
        "fb",
        DIM,
        optimizer,
        kernels,
        2 * shards,
        str(tmp_path / "ssd"),
        access_threshold=extra.pop("access", 2),
        eviction_threshold=4,
        not_admitted="hashed",
        fallback_buckets=7,
        dynamic_expansion=True,
        capacity=4,
        num_shards=shards,
        **extra,
    )
    rng = np.random.default_rng(len(ops))
    probe = np.arange(-2, KEYS + 3, dtype=np.int64)  # admitted, counting, unknown keys
    clock, cold_reads = 100, 0
    try:
        for op in ops:
            if op[0] == "train":  # the training lookups' rows, fallback rows included
                clock += op[2]
                pair.train(op[1], clock, rng)
            elif op[0] == "evict":
                pair.evict(clock + op[1])
            elif op[0] == "swap":
                pair.swap(tmp_path)
            pair.assert_same()
            _same_fallback(pair)
            want = pair.mem.read(probe)
            np.testing.assert_array_equal(pair.tier.read(probe), want)
            cold_reads += pair.stats()["cold_keys"] > 0
        assert cold_reads > 0, "no inference lookup met a key on disk"
        return pair.stats()
    finally:
        pair.close()


_op = st.one_of(
    st.tuples(
        st.just("train"),
        st.lists(st.integers(-2, KEYS), min_size=1, max_size=10, unique=True),
        st.integers(0, 3),
    ),
    st.tuples(st.just("evict"), st.integers(0, 4)),
    st.tuples(st.just("swap"), st.just(0)),
)


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(_op, min_size=4, max_size=12))
@pytest.mark.parametrize("kernels", PATHS)
def test_lookups_exports_and_the_fallback_equal_an_in_memory_table(tmp_path_factory, kernels, ops):
    first = ("train", list(range(12)), 1)
    ops = [first, first, *ops]  # 12 keys admitted at their second sighting, 10 go to disk
    _registry.clear()
    _run(tmp_path_factory.mktemp("tierfb"), "eager", kernels, ops)


def _busy_ops(steps=14, seed=0):
    rng = np.random.default_rng(seed)
    ops = []
    for i in range(steps):
        ids = rng.choice(KEYS, size=int(rng.integers(2, 10)), replace=False).tolist()
        ops.append(("train", ids, 1))
        if i % 6 == 5:
            ops.append(("evict", 2))
        if i % 7 == 6:
            ops.append(("swap", 0))
    return ops


@pytest.mark.parametrize(
    "mode,optimizer,shards,value_dtype,access",
    [
        ("eager", "sgd", 2, "float32", 3),
        ("eager", "rowwise_adagrad", 1, "bfloat16", 2),
        ("eager", "adam", 2, "float16", 2),
    ],
)
def test_every_step_promotes_and_demotes_with_the_fallback_unchanged(
    tmp_path, mode, optimizer, shards, value_dtype, access
):
    stats = _run(
        tmp_path,
        mode,
        HAVE_CXX,
        _busy_ops(),
        optimizer=optimizer,
        shards=shards,
        value_dtype=value_dtype,
        access=access,
    )
    assert stats["promotions"] > 0 and stats["demotions"] > 0


def test_a_tiered_table_on_parameter_servers_is_refused_naming_why(tmp_path):
    with table_placement(2), pytest.raises(npu_rec.ConfigError, match="parameter servers"):
        npu_rec.create_table(
            "on_ps",
            DIM,
            optimizer=npu_rec.optimizers.Adagrad(0.1),
            memory_rows=4,
            ssd_path=str(tmp_path),
        )
