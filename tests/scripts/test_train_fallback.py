"""train.py --not_admitted: ids below --access_threshold read and train a hashed fallback."""

import glob
import json
import os

import pytest
from absl import flags
from absl.testing import flagsaver

from npu_rec.checkpoint import _file_format
from npu_rec.scripts import evaluate, export, train

TINY = dict(batch_size=128, max_steps=6, eval_steps=2, save_steps=6, verbose=0)


def test_a_hashed_run_saves_the_trained_fallback_with_the_tables(tmp_path):
    # Both front ends build their tables from the same settings (`_frontends._model_kwargs`);
    # the Estimator with a fallback is covered by tests/estimator/test_export_fallback.py.
    model_dir = tmp_path / "keras"
    with flagsaver.flagsaver(
        **TINY,
        access_threshold=3,
        not_admitted="hashed",
        fallback_buckets=512,
        model_dir=str(model_dir),
    ):
        train.main(["train.py"])
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and 0.0 <= metrics["eval_auc"] <= 1.0
    record = json.loads((model_dir / "run_flags.json").read_text())
    assert record["not_admitted"] == "hashed" and record["fallback_buckets"] == 512
    files = glob.glob(os.path.join(model_dir, "**", "*.nrc"), recursive=True)
    arrays, _ = _file_format.read_file(sorted(files)[-1])
    values = arrays["tables/categorical/fallback/values"]
    assert values.shape == (512, 8)
    assert int(arrays["tables/categorical/fallback/step"]) > 0  # trained
    # evaluate and export take --not_admitted from the run's record.
    with flagsaver.flagsaver(model_dir=str(model_dir), eval_steps=1, verbose=0):
        evaluate.main(["evaluate.py"])
    assert json.loads((model_dir / "eval_metrics.json").read_text())["global_step"] == 6
    with flagsaver.flagsaver(model_dir=str(model_dir), export_dir=str(tmp_path / "serving")):
        path = export.run()
    assert os.path.exists(os.path.join(path, "saved_model.pb"))


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(not_admitted="hashed"), "--not_admitted=hashed needs --access_threshold >= 2"),
        (
            dict(not_admitted="hashed", access_threshold=1),
            "--not_admitted=hashed needs --access_threshold >= 2",
        ),
    ],
)
def test_hashed_without_admission_fails_before_any_work(bad, message):
    with pytest.raises(flags.IllegalFlagValueError, match=message):
        with flagsaver.flagsaver(**bad):
            train.main(["train.py"])


def test_flag_values_are_checked_at_parsing():
    with flagsaver.flagsaver():
        with pytest.raises(flags.IllegalFlagValueError, match="not_admitted"):
            flags.FLAGS["not_admitted"].parse("hash")
        with pytest.raises(flags.IllegalFlagValueError, match="fallback_buckets"):
            flags.FLAGS["fallback_buckets"].parse("0")
