import pytest
from absl import flags, logging


@pytest.fixture(autouse=True, scope="session")
def _parsed_flags():
    """Scripts read absl flags; tests set them with flagsaver, not a command line."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


@pytest.fixture(autouse=True)
def _keep_log_verbosity():
    """Scripts set absl's verbosity for their run; other tests must not inherit it."""
    absl_logger = logging.get_absl_logger()
    level = absl_logger.level
    yield
    absl_logger.setLevel(level)


@pytest.fixture(autouse=True)
def _forget_npu_rec_settings():
    """Scripts call npu_rec.init; later tests must start from the defaults."""
    import npu_rec

    yield
    npu_rec.shutdown()
