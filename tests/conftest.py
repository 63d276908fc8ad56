"""Test setup: small TF thread pools, fresh table registry per test."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

from npu_rec import _table_registry  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_registry():
    _table_registry.clear()
    yield
    _table_registry.clear()
