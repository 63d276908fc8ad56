"""`evaluate` / `predict` with a `checkpoint_path` outside `model_dir` use its tables."""

import shutil

import numpy as np
import pytest

import npu_rec
from npu_rec import estimator as E
from tests.estimator import models

PARAMS = {"dim": 4, "hidden": (8,)}


def _est(model_dir):
    return E.NPUEstimator(
        models.deepfm_model_fn,
        params=PARAMS,
        config=E.NPURunConfig(
            model_dir=str(model_dir),
            random_seed=1,
            log_step_count_steps=None,
            save_summary_steps=None,
        ),
    )


def test_checkpoint_of_another_model_dir_restores_its_tables(tmp_path):
    trained = _est(tmp_path / "a")
    trained.train(models.synthetic_input_fn(0, 640, batch_size=64), max_steps=10)
    eval_fn = models.synthetic_input_fn(640, 1280, batch_size=64)
    want = trained.evaluate(eval_fn)
    want_pred = [p["logits"] for p in trained.predict(eval_fn)]
    npu_rec.shutdown()
    other = _est(tmp_path / "b")
    got = other.evaluate(eval_fn, checkpoint_path=trained.latest_checkpoint())
    assert got["global_step"] == 10
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    np.testing.assert_allclose(got["auc"], want["auc"], rtol=1e-6)
    npu_rec.shutdown()
    pred = [p["logits"] for p in other.predict(eval_fn, checkpoint_path=str(tmp_path / "a"))]
    np.testing.assert_allclose(pred, want_pred, rtol=1e-5, atol=1e-6)
    # Dense files without the tables next to them: a clear error, not silent zeros.
    (tmp_path / "c").mkdir()
    for f in (tmp_path / "a").glob("model.ckpt-10.*"):
        shutil.copy(f, tmp_path / "c")
    npu_rec.shutdown()
    with pytest.raises(ValueError, match="has no sparse-table save at step 10"):
        other.evaluate(eval_fn, checkpoint_path=str(tmp_path / "c" / "model.ckpt-10"))
