"""Helpers shared by the table tests: optimizer pairs and state comparison."""

from __future__ import annotations

import numpy as np

import npu_rec
from tests.table.table_reference import RefOptimizer

OPTIMIZERS = {
    "sgd": (lambda: npu_rec.optimizers.SGD(0.1), lambda: RefOptimizer("sgd", learning_rate=0.1)),
    "adagrad": (
        lambda: npu_rec.optimizers.Adagrad(0.1),
        lambda: RefOptimizer(
            "adagrad", learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7
        ),
    ),
    "adam": (
        lambda: npu_rec.optimizers.Adam(0.01),
        lambda: RefOptimizer("adam", learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
    ),
    "ftrl": (
        lambda: npu_rec.optimizers.Ftrl(0.1, l1=0.001, l2=0.01),
        lambda: RefOptimizer(
            "ftrl",
            learning_rate=0.1,
            learning_rate_power=-0.5,
            initial_accumulator_value=0.1,
            l1=0.001,
            l2=0.01,
        ),
    ),
}


def assert_same_state(table, ref, atol=1e-5):
    """Asserts keys, rows, slots, counts, last-seen and pending counters agree."""
    got, want = table.export(), ref.export()
    np.testing.assert_array_equal(got["keys"], want["keys"])
    np.testing.assert_allclose(got["values"], want["values"], atol=atol)
    np.testing.assert_array_equal(got["counts"], want["counts"])
    np.testing.assert_array_equal(got["last_seen"], want["last_seen"])
    assert sorted(got["slots"]) == sorted(want["slots"])
    for name in want["slots"]:
        np.testing.assert_allclose(got["slots"][name], want["slots"][name], atol=atol)
    st = table.read_state()
    pending = {
        int(k): (int(c), int(t))
        for k, c, t in zip(
            st["pending_keys"], st["pending_counts"], st["pending_last_seen"], strict=True
        )
    }
    assert pending == want["pending"]
    assert int(table.size()) == len(want["keys"])


def full_state(table) -> dict[str, np.ndarray]:
    """Every array of the table's state (keys, rows, slots, counts, last-seen, pending...)."""
    return {k: np.array(v) for k, v in table.read_state().items()}


def assert_same_states(got: dict, want: dict, atol=1e-6):
    """Two `full_state`s agree: floats within `atol`, integers exactly."""
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(got[name], value, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], value, err_msg=name)
