"""A `model_dir` that cannot be a directory is refused at construction, naming it."""

import pytest

from npu_rec import estimator as E


def _model_fn(features, labels, mode):
    raise AssertionError("never built")


@pytest.mark.parametrize("inside", [False, True])
def test_model_dir_that_is_a_file_is_refused_naming_it(tmp_path, inside):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("precious")
    model_dir = blocker / "run" if inside else blocker
    with pytest.raises(
        ValueError,
        match=rf"`model_dir` must be a directory, but "
        rf"'{blocker}' is a file\. Received: "
        rf"model_dir='{model_dir}'\. .*another path",
    ):
        E.NPUEstimator(_model_fn, config=E.NPURunConfig(model_dir=str(model_dir)))
    assert blocker.read_text() == "precious"
