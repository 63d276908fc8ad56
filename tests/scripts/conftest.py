import pytest
from absl import flags


@pytest.fixture(autouse=True)
def _parsed_flags():
    """Scripts read absl flags; tests set them with flagsaver, not a command line."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
