r"""Exports a trained run as a SavedModel whose signature takes raw ids.

Examples:
  python3 run.py script export --model_dir=/tmp/run --export_dir=/tmp/serving

The SavedModel holds the dense weights and the table rows (admitted keys
only; unknown ids read zeros) and uses only standard TensorFlow ops:
`tf.saved_model.load(path).signatures["serving_default"]` serves it without
npu_rec. Inputs: each dense feature float32 `[batch]`, each categorical
feature int64 `[batch]` of raw ids. The model flags default to those the
training run recorded in --model_dir/run_flags.json.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from npu_rec._paths import file_in_the_way
from npu_rec.scripts import _cli
from npu_rec.scripts import _flags as F
from npu_rec.scripts.train import settings_and_plan

_checkpoints = _cli.lazy("npu_rec.scripts._checkpoints")
_frontends = _cli.lazy("npu_rec.scripts._frontends")

_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "Where to write the SavedModel.")


@flags.validator("export_dir")
def _export_dir_is_a_directory(value):
    blocker = value and file_in_the_way(value)
    if blocker:
        raise flags.ValidationError(
            f"--export_dir={value!r}: {blocker!r} is a file, not a directory: give another "
            "--export_dir (or move the file away)."
        )
    return True


flags.adopt_module_key_flags(F)


def run() -> str:
    """Exports the run of --model_dir to --export_dir; returns the SavedModel path."""
    if not _EXPORT_DIR.value:
        raise app.UsageError("--export_dir is required. Received: --export_dir=None")
    if not F.MODEL_DIR.value or not _checkpoints.restorable_versions(F.MODEL_DIR.value):
        raise app.UsageError(
            f"--model_dir must hold a checkpoint of a training run. "
            f"Received: --model_dir={F.MODEL_DIR.value!r}"
        )
    settings, plan = settings_and_plan()
    import tensorflow as tf

    from npu_rec import estimator as E
    from npu_rec.keras import callbacks as kcb
    from npu_rec.keras import export_for_serving

    _frontends.init_npu_rec(settings)
    if settings.frontend == "keras":
        model = _frontends.keras_model(settings, plan)
        kcb.SparseCheckpoint(settings.model_dir, restore=True).prepare(model)
        path = export_for_serving(model, _EXPORT_DIR.value)
        path = _EXPORT_DIR.value if path is None else path
    else:
        spec = {n: tf.TensorSpec([None], tf.float32) for n in plan.dense}
        spec.update({n: tf.TensorSpec([None], tf.int64) for n in plan.categorical})
        est = _frontends.estimator(settings, plan)
        path = est.export_saved_model(
            _EXPORT_DIR.value, E.build_raw_serving_input_receiver_fn(spec)
        )
    path = path.decode() if isinstance(path, bytes) else str(path)
    print(f"exported={path}", flush=True)
    return path


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    F.check_now()
    _cli.quiet_logs()
    run()


if __name__ == "__main__":
    _cli.run(main, __doc__, own=("export_dir",))
