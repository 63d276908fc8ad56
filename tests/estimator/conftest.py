"""Every Estimator test starts from default npu_rec settings and no tables."""

import pytest

import npu_rec


@pytest.fixture(autouse=True)
def _fresh_npu_rec():
    npu_rec.shutdown()
    yield
    npu_rec.shutdown()
