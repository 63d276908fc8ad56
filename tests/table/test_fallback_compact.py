"""The trained fallback of a compact table, its checkpoints across optimizers, its save check.

* Storage: the fallback rows of a bfloat16/float16 table are stored in that
  dtype and an optimizer step rounds them stochastically as the table's rows
  are rounded (`tests/table/table_reference.py`'s `stochastic_round`), with
  the bucket as the key, the fallback's update count as the step and the
  seed of the name `<table>/fallback`; a row-wise optimizer keeps one slot
  value per fallback row. A NumPy model of the fallback must match both table
  paths bit for bit, and an admitted key's row must be its fallback row's bits.
* Restores across the two Adagrad layouts (per element, per row) convert the
  accumulator (mean / repeat, logged); any other slot mismatch is a
  `ValueError` naming the table, the slot, both shapes and the optimizer,
  raised before the table changes.
* Saves refuse a fallback holding NaN or Inf, as they refuse such table rows.
"""

import logging
import os
import shutil
import zlib

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.table import _registry
from npu_rec.table._fallback import bucket_of_numpy
from tests.table.table_reference import RefOptimizer, nearest, stochastic_round

HAVE_CXX = shutil.which(os.environ.get("CXX") or "g++") is not None
PATHS = [
    pytest.param(False, id="stock"),
    pytest.param(
        True,
        id="kernels",
        marks=pytest.mark.skipif(
            not HAVE_CXX or os.environ.get("NPU_REC_KERNELS") == "off",
            reason="the kernel path is not built",
        ),
    ),
]
OPTIMIZERS = {
    "sgd": (lambda: npu_rec.optimizers.SGD(0.1), lambda: RefOptimizer("sgd", learning_rate=0.1)),
    "rowwise_adagrad": (
        lambda: npu_rec.optimizers.RowWiseAdagrad(0.1),
        lambda: RefOptimizer(
            "rowwise_adagrad", learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7
        ),
    ),
    "adagrad": (
        lambda: npu_rec.optimizers.Adagrad(0.1),
        lambda: RefOptimizer(
            "adagrad", learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7
        ),
    ),
}


def _bits(values) -> np.ndarray:
    return np.asarray(values).astype(np.float32).view(np.uint32)


class FallbackReference:
    """NumPy model of a compact fallback: per-bucket rows (float32 values of `dtype`) and slots."""

    def __init__(self, rows0, dtype, optimizer: RefOptimizer, seed: int):
        self.rows = np.asarray(rows0).astype(np.float32)
        self.dtype, self.opt, self.seed = dtype, optimizer, seed
        self.slots = [optimizer.slots(self.rows.shape[1]) for _ in range(len(self.rows))]
        self.step = 0

    def apply(self, ids, grads) -> None:
        """One update from `apply_gradients(ids, grads)` of keys without a row (ids unique)."""
        self.step += 1
        buckets = bucket_of_numpy(ids, len(self.rows))
        summed: dict[int, np.ndarray] = {}
        for b, g in zip(buckets, np.asarray(grads, np.float32), strict=True):
            summed[int(b)] = summed[int(b)] + g if int(b) in summed else g.copy()
        for b, g in summed.items():
            row = {"value": self.rows[b].copy(), "slots": self.slots[b]}
            self.opt.update(row, g, self.step)
            self.rows[b] = stochastic_round(
                row["value"][None], [b], self.step, self.seed, self.dtype
            )[0]


@pytest.mark.parametrize("kernels", PATHS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("opt", ["sgd", "rowwise_adagrad"])
@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    buckets=st.sampled_from([1, 3, 16]),
    batches=st.lists(
        st.lists(st.integers(-50, 50), min_size=1, max_size=8, unique=True),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_compact_fallback_rows_round_like_table_rows_bit_for_bit(
    kernels, dtype, opt, buckets, batches, seed
):
    _registry.clear()
    rng = np.random.default_rng(seed)
    make, ref_opt = OPTIMIZERS[opt]
    dim = 3
    with _build.forced(kernels):
        table = npu_rec.create_table(
            "cfb",
            dim,
            optimizer=make(),
            access_threshold=1000,  # nobody is admitted: every id trains the fallback
            not_admitted="hashed",
            fallback_buckets=buckets,
            value_dtype=dtype,
        )
    assert table.fallback.values.dtype == tf.as_dtype(dtype)
    widths = {n: v.shape[1] for n, v in table.fallback.slots.items()}
    assert widths == ({"accumulator": 1} if opt == "rowwise_adagrad" else {})
    ref = FallbackReference(
        table.fallback.values.numpy(), dtype, ref_opt(), zlib.crc32(b"cfb/fallback")
    )
    for batch in batches:
        ids = np.asarray(batch, np.int64)
        # Gradients in 1/8 steps: sums of a bucket are exact in any order.
        grads = (rng.integers(-16, 17, size=(len(ids), dim)) / 8).astype(np.float32)
        emb = npu_rec.sparse_lookup(table, tf.constant(ids))
        want = ref.rows[bucket_of_numpy(ids, buckets)]
        np.testing.assert_array_equal(_bits(emb.numpy()), _bits(want))
        table.apply_gradients(tf.constant(ids), tf.constant(grads))
        ref.apply(ids, grads)
        np.testing.assert_array_equal(_bits(table.fallback.values.numpy()), _bits(ref.rows))
        for name, var in table.fallback.slots.items():
            np.testing.assert_array_equal(
                _bits(var.numpy()), _bits(np.stack([s[name] for s in ref.slots]))
            )
    assert table.size() == 0


@pytest.mark.parametrize("kernels", PATHS)
def test_an_admitted_key_starts_from_its_compact_fallback_rows_bits(kernels):
    with _build.forced(kernels):
        table = npu_rec.create_table(
            "adm",
            4,
            optimizer=npu_rec.optimizers.SGD(0.3),
            access_threshold=2,
            not_admitted="hashed",
            fallback_buckets=5,
            value_dtype="bfloat16",
        )
    ids = tf.constant([7], tf.int64)
    npu_rec.sparse_lookup(table, ids)
    table.apply_gradients(ids, tf.constant([[0.01, -0.02, 0.03, 0.5]]))
    row = table.fallback.values.numpy()[bucket_of_numpy([7], 5)[0]]
    emb = npu_rec.sparse_lookup(table, ids)  # second sighting: admitted
    assert table.size() == 1
    got = table.export()["values"][0]
    assert got.dtype == row.dtype
    np.testing.assert_array_equal(_bits(got), _bits(row))
    np.testing.assert_array_equal(_bits(emb.numpy()[0]), _bits(row))


def test_a_float32_fallback_restores_into_a_compact_table_rounded_to_nearest(tmp_path):
    def make(dtype):
        return npu_rec.create_table(
            "xd",
            3,
            optimizer=npu_rec.optimizers.Adagrad(0.1),
            access_threshold=3,
            not_admitted="hashed",
            fallback_buckets=8,
            value_dtype=dtype,
        )

    wide = make("float32")
    ids = tf.constant([1, 2, 3, 4], tf.int64)
    npu_rec.sparse_lookup(wide, ids)
    wide.apply_gradients(ids, tf.constant(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)))
    wide.save(str(tmp_path / "w.nrc"))
    saved = wide.read_state()
    _registry.clear()
    narrow = make("bfloat16")
    narrow.restore(str(tmp_path / "w.nrc"))
    np.testing.assert_array_equal(
        _bits(narrow.fallback.values.numpy()), _bits(nearest(saved["fallback/values"], "bfloat16"))
    )
    np.testing.assert_array_equal(
        narrow.fallback.slots["accumulator"].numpy(), saved["fallback/slot/accumulator"]
    )
    narrow.save(str(tmp_path / "n.nrc"))  # stored as bfloat16, back into float32 exactly
    _registry.clear()
    again = make("float32")
    again.restore(str(tmp_path / "n.nrc"))
    np.testing.assert_array_equal(
        again.fallback.values.numpy(), nearest(saved["fallback/values"], "bfloat16")
    )


# ------------------------------------------------------ restores across optimizers
def _adagrad_table(name, opt, num_shards=1, **kwargs):
    return npu_rec.create_table(
        name,
        4,
        optimizer=OPTIMIZERS[opt][0](),
        access_threshold=2,
        not_admitted="hashed",
        fallback_buckets=6,
        num_shards=num_shards,
        **kwargs,
    )


def _trained(table):
    rng = np.random.default_rng(3)
    for _ in range(3):
        ids = tf.constant(rng.integers(0, 30, size=10), tf.int64)
        npu_rec.sparse_lookup(table, ids)
        table.apply_gradients(ids, tf.constant(rng.normal(size=(10, 4)), tf.float32))
    return table


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize(
    "saved, restored", [("adagrad", "rowwise_adagrad"), ("rowwise_adagrad", "adagrad")]
)
def test_an_accumulator_restores_across_the_adagrad_layouts_converted(
    tmp_path, caplog, saved, restored, num_shards
):
    source = _trained(_adagrad_table("lay", saved))
    manager = TableCheckpointManager(str(tmp_path), [source])
    manager.save(1)
    want = source.read_state()
    _registry.clear()
    target = _adagrad_table("lay", restored, num_shards=num_shards)
    with caplog.at_level(logging.INFO, logger="absl"):  # npu_rec logs through absl's logger
        TableCheckpointManager(str(tmp_path), [target]).restore(1)
    assert "slot 'accumulator'" in caplog.text and "converted" in caplog.text
    got = target.read_state()
    np.testing.assert_array_equal(got["keys"], want["keys"])
    np.testing.assert_array_equal(got["values"], want["values"])
    for prefix in ("slot/", "fallback/slot/"):
        acc = want[f"{prefix}accumulator"]
        if restored == "rowwise_adagrad":  # the row-wise accumulator of the same gradients
            expected = acc.mean(axis=1, keepdims=True)
        else:
            expected = np.repeat(acc, 4, axis=1)
        np.testing.assert_allclose(got[f"{prefix}accumulator"], expected, rtol=1e-6)
    np.testing.assert_array_equal(got["fallback/values"], want["fallback/values"])
    _trained(target)  # and it trains on


def test_a_row_wise_accumulator_is_the_mean_of_the_element_wise_one_for_the_same_gradients():
    """Why the conversion is the mean: both rules see the same gradients."""
    tables = [_trained(_adagrad_table(f"same_{o}", o)) for o in ("adagrad", "rowwise_adagrad")]
    element, row = (t.export()["slots"]["accumulator"] for t in tables)
    np.testing.assert_allclose(element.mean(axis=1, keepdims=True), row, rtol=1e-5)


def test_a_slot_that_fits_no_layout_is_refused_naming_table_slot_shapes_and_optimizer():
    table = _trained(_adagrad_table("bad_slot", "adagrad"))
    before = table.read_state()
    state = dict(before)
    state["slot/accumulator"] = np.ones([len(state["keys"]), 3], np.float32)
    with pytest.raises(
        ValueError,
        match=r"Cannot restore sparse table 'bad_slot': slot 'accumulator' of its rows was "
        rf"saved with shape \({len(state['keys'])}, 3\), but the table's optimizer Adagrad "
        rf"keeps it with shape \({len(state['keys'])}, 4\)",
    ):
        table.write_state(state)
    state = {k: v for k, v in before.items() if k != "slot/accumulator"}
    with pytest.raises(ValueError, match=r"'bad_slot'.*Adagrad.*slot 'accumulator'.*lacks"):
        table.write_state(state)
    after = table.read_state()  # nothing changed
    for key in ("keys", "values", "slot/accumulator", "fallback/values"):
        np.testing.assert_array_equal(after[key], before[key])


def test_a_fallback_slot_that_fits_no_layout_is_refused():
    table = _trained(_adagrad_table("bad_fb", "rowwise_adagrad"))
    state = dict(table.read_state())
    state["fallback/slot/accumulator"] = np.ones([6, 2], np.float32)
    with pytest.raises(
        ValueError,
        match=r"'bad_fb': slot 'accumulator' of its fallback rows was saved with shape "
        r"\(6, 2\).*RowWiseAdagrad keeps it with shape \(6, 1\)",
    ):
        table.write_state(state)


def test_a_file_of_another_optimizer_with_other_slots_is_refused(tmp_path):
    _trained(_adagrad_table("other", "adagrad")).save(str(tmp_path / "o.nrc"))
    _registry.clear()
    target = npu_rec.create_table(
        "other", 4, optimizer=npu_rec.optimizers.Adam(0.1), access_threshold=2
    )
    with pytest.raises(ValueError, match=r"'other'.*slots=\['accumulator'\].*optimizer"):
        target.restore(str(tmp_path / "o.nrc"))


# ------------------------------------------------------------- the save check
def _poison(table, what):
    b = int(bucket_of_numpy([5], 6)[0])
    var = table.fallback.values if what == "values" else table.fallback.slots["accumulator"]
    row = np.asarray(var.numpy()).astype(np.float32)
    row[b, 0] = np.nan if what == "values" else np.inf
    var.assign(row.astype(var.dtype.as_numpy_dtype))
    return b


@pytest.mark.parametrize("what", ["values", "slot/accumulator"])
@pytest.mark.parametrize("num_shards", [1, 2])
def test_a_non_finite_fallback_is_refused_by_every_save(tmp_path, what, num_shards):
    table = _trained(_adagrad_table("nf", "adagrad", num_shards=num_shards))
    manager = TableCheckpointManager(str(tmp_path / "ck"), [table])
    manager.save(1)
    before = sorted(os.listdir(tmp_path / "ck"))
    bucket = _poison(table, what)
    match = (
        rf"'nf' holds NaN or Inf in its trained fallback.*1 rows of `{what}` "
        rf"\(e.g. bucket {bucket}\).*not saved"
    )
    for save in (
        lambda: manager.save(2),
        lambda: manager.save(2, delta=True),
        lambda: table.save(str(tmp_path / "single")),
    ):
        with pytest.raises(npu_rec.TableInvariantError, match=match):
            save()
    assert sorted(os.listdir(tmp_path / "ck")) == before
    assert manager.latest_version() == 1
    assert np.isnan(table.export()["values"]).sum() == 0  # export reads without the check
    manager.restore(1)  # the previous version is intact, and saves again
    manager.save(2)


def test_a_graph_mode_save_checks_the_fallback(tmp_path):
    with tf.Graph().as_default():
        table = _adagrad_table("g_nf", "adagrad")
        poison = table.fallback.values.assign(tf.fill([6, 4], np.float32(np.nan)))
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session() as sess:
            sess.run(init)
            table.save(str(tmp_path / "ok"), session=sess)
            sess.run(poison)
            with pytest.raises(npu_rec.TableInvariantError, match=r"6 rows of `values`"):
                table.save(str(tmp_path / "bad"), session=sess)
