"""Every Keras front-end test starts from default npu_rec settings."""

import pytest

import npu_rec


@pytest.fixture(autouse=True)
def _fresh_config():
    npu_rec.shutdown()
    yield
    npu_rec.shutdown()
