"""Test-wide settings: quiet TensorFlow, small thread pools, fixed seeds, fresh table registry."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf

# Two cores on CI machines: keep TensorFlow from oversubscribing them.
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)

from npu_rec._kernels import _build  # noqa: E402
from npu_rec.table import _registry as _table_registry  # noqa: E402

# Build (or load from the cache) the table kernels once, before any test: the
# suite runs on the kernel path when a compiler is present, on the stock path
# otherwise (NPU_REC_KERNELS=off forces it); tests/table/test_table_kernels.py runs both.
_build.library()


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _fresh_registry():
    _table_registry.clear()
    yield
    _table_registry.clear()
