r"""Evaluates the checkpoint of a training run (latest, or --restore_model_version).

Examples:
  python3 run.py script evaluate --model_dir=/tmp/run   # the model flags of the run
  python3 run.py script evaluate --model_dir=/tmp/run --restore_model_version=200 --eval_steps=100

The model flags (--frontend, --model, --embedding_dim, --table_per_feature,
thresholds, --data and its columns) default to those the training run
recorded in --model_dir/run_flags.json; a value that would build another
model is refused. Prints `eval_loss=... eval_auc=...` and writes
eval_metrics.json (on a read-only --model_dir it warns that it could not,
after printing the metrics).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from npu_rec._paths import atomic_file
from npu_rec.scripts import _cli
from npu_rec.scripts import _flags as F
from npu_rec.scripts.train import settings_and_plan

_checkpoints = _cli.lazy("npu_rec.scripts._checkpoints")
_frontends = _cli.lazy("npu_rec.scripts._frontends")

flags.adopt_module_key_flags(F)


def run() -> dict:
    """Restores the run of --model_dir and evaluates it; returns the metrics."""
    if not F.MODEL_DIR.value or not _checkpoints.restorable_versions(F.MODEL_DIR.value):
        raise app.UsageError(
            f"--model_dir must hold a checkpoint of a training run. "
            f"Received: --model_dir={F.MODEL_DIR.value!r}"
        )
    settings, plan = settings_and_plan()
    settings.verbose = 0
    metrics, _, _ = _frontends.run(settings, plan, train=False)
    out = {
        k: metrics[k]
        for k in (
            "frontend",
            "model",
            "data",
            "global_step",
            "eval_loss",
            "eval_auc",
            "table_sizes",
        )
    }
    print(
        f"eval_loss={out['eval_loss']:.4f} eval_auc={out['eval_auc']:.4f} "
        f"global_step={out['global_step']}",
        flush=True,
    )
    path = os.path.join(settings.model_dir, "eval_metrics.json")
    try:
        with atomic_file(path) as f:
            json.dump(out, f, indent=2)
    except OSError as err:  # e.g. a read-only --model_dir: the metrics are printed above
        print(
            f"npu_rec: warning: the metrics were not written to {path} ({err.strerror or err}).",
            file=sys.stderr,
            flush=True,
        )
    return out


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    F.check_now()
    _cli.quiet_logs()
    run()


if __name__ == "__main__":
    _cli.run(main, __doc__)
