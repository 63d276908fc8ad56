"""The gradient buffer a worker sends its owners: the kernel path against the stock ops.

Each lookup's per-id gradients are summed per unique row and laid out one
lookup after another, padded to the widest table (`Lookups._gradient_buffer`);
checked against a NumPy reference on random lookups, with the kernel
(`NpuRecSumSlices`) and with the stock ops (`tf.scatter_nd` per lookup).
"""

from __future__ import annotations

import os
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_rec._kernels import _build
from npu_rec._kernels import _ops as kernel_ops
from npu_rec.distribute import _step_exchange, _worker_table
from npu_rec.table._fused import KernelBackend
from npu_rec.table._stock import StockBackend

needs_kernels = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX") or "g++") is None
    or os.environ.get("NPU_REC_KERNELS") == "off",
    reason="no C++ compiler, or NPU_REC_KERNELS=off: the kernel path is not built",
)

_LOOKUP = st.tuples(
    st.integers(0, 30),  # unique rows u
    st.sampled_from([1, 3, 16]),  # the table's dim
    st.sampled_from(["slices", "dense", "none", "two"]),  # the gradient's form
    st.integers(0, 80),  # per-id gradients (slices)
)


def _buffer(lookups, seed: int):
    """(the `Lookups` stand-in, its grads, the NumPy reference buffer)."""
    rng = np.random.default_rng(seed)
    width = max(dim for _, dim, _, _ in lookups)
    entries, grads, ref = [], {}, []
    for i, (u, dim, form, n) in enumerate(lookups):
        table = types.SimpleNamespace(dim=dim)
        entries.append(types.SimpleNamespace(table=table, keys=tf.range(u, dtype=tf.int64)))
        summed = np.zeros((u, width), np.float32)
        if form == "dense" or (form != "none" and u == 0):
            g = rng.normal(size=(u, dim)).astype(np.float32)
            grads[i] = tf.constant(g)
            summed[:, :dim] = g
        elif form in ("slices", "two"):
            at = rng.integers(0, u, n)
            values = rng.normal(size=(n, dim)).astype(np.float32)
            if form == "two":  # two records of one lookup, as `apply_records_together` adds them
                half = n // 2
                grads[i] = _worker_table._add(
                    tf.IndexedSlices(values[:half], tf.constant(at[:half], tf.int32), [u, dim]),
                    tf.IndexedSlices(values[half:], tf.constant(at[half:]), [u, dim]),
                )
            else:
                grads[i] = tf.IndexedSlices(values, tf.constant(at, tf.int32), [u, dim])
            np.add.at(summed[:, :dim], at, values)
        ref.append(summed)
    lookups_obj = object.__new__(_step_exchange.Lookups)
    lookups_obj.entries = entries
    lookups_obj.width = width
    return lookups_obj, grads, np.concatenate(ref, 0)


def _on(obj, kernels: bool):
    """`obj` with every lookup's table on the kernel backend, or on the stock one."""
    backend = object.__new__(KernelBackend if kernels else StockBackend)
    for e in obj.entries:
        e.table.local = types.SimpleNamespace(backend=backend)
    return obj


@settings(max_examples=20, deadline=None)
@given(lookups=st.lists(_LOOKUP, min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_gradient_buffer_sums_each_lookup_per_row_stock_path(lookups, seed):
    obj, grads, ref = _buffer(lookups, seed)
    got = _on(obj, False)._gradient_buffer(grads).numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@needs_kernels
@settings(max_examples=30, deadline=None)
@given(lookups=st.lists(_LOOKUP, min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_gradient_buffer_sums_each_lookup_per_row_kernel_path(lookups, seed):
    obj, grads, ref = _buffer(lookups, seed)
    got = _on(obj, True)._gradient_buffer(grads).numpy()
    stock = _on(obj, False)._gradient_buffer(grads).numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # Both sum a row's copies in index order: the same float32 bits.
    np.testing.assert_array_equal(got, stock)


@needs_kernels
def test_sum_slices_refuses_an_index_outside_its_part():
    with _build.forced(True):
        good = (tf.zeros([1, 2]), tf.constant([0], tf.int64), 1)
        bad = (tf.zeros([2, 2]), tf.constant([1, 2], tf.int64), 2)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"part 1: indices\[1\] = 2 is not in \[0, 2\)"
        ):
            kernel_ops.sum_slices([good, bad], 2)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"dim <= 2"):
            kernel_ops.sum_slices([(tf.zeros([1, 3]), tf.constant([0], tf.int64), 1)], 2)


@needs_kernels
@settings(max_examples=30, deadline=None)
@given(
    u=st.integers(1, 50),
    n=st.sampled_from([0, 1, 9, 500]),
    inner=st.sampled_from([(), (1,), (4,), (18,), (2, 3)]),
    dtype=st.sampled_from([tf.float32, tf.int32, tf.int64]),
    index_dtype=st.sampled_from([tf.int32, tf.int64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_take_is_tf_gather(u, n, inner, dtype, index_dtype, seed):
    """`NpuRecTake` (the exchange's buffer fills) against `tf.gather`, bit for bit."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-(2**31), 2**31 - 1, (u, *inner))
    if dtype == tf.float32:  # any float32 bits (NaN payloads, denormals) come back as sent
        params = tf.bitcast(tf.constant(values, tf.int32), tf.float32)
    else:
        params = tf.constant(values, dtype)
    index = tf.constant(rng.integers(0, u, n), index_dtype)
    with _build.forced(True):
        got = kernel_ops.take(params, index)
    assert got.dtype == dtype and got.shape == (n, *inner)
    want = tf.gather(params, index)
    if dtype == tf.float32:
        got, want = tf.bitcast(got, tf.int32), tf.bitcast(want, tf.int32)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@needs_kernels
def test_take_refuses_an_index_outside_the_rows():
    with _build.forced(True):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"index\[1\] = 3 is not in \[0, 3\)"
        ):
            kernel_ops.take(tf.zeros([3, 2]), tf.constant([0, 3], tf.int32))
