r"""Online training: an endless stream, timed full/delta checkpoints, eviction.

MindSpore Rec's `online_train` on the Keras front end: trains until global
step --max_steps on a stream (synthetic by default, or --data files read in
sweeps forever), writing a full table checkpoint every
--save_checkpoint_due_time seconds and a delta every
--save_delta_checkpoints_secs, and evicting ids idle for --eviction_threshold
seconds every --evict_steps steps. Restarting with the same --model_dir
resumes from the latest version (tables, dense state and the stream position).

Examples:
  python3 run.py script online_train --model_dir=/tmp/online --max_steps=2000
  python3 run.py script online_train --model_dir=/tmp/online --access_threshold=2 \
      --eviction_threshold=3600 --save_delta_checkpoints_secs=30
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from npu_rec.scripts import _cli
from npu_rec.scripts import _flags as F
from npu_rec.scripts.train import already_complete, finish, settings_and_plan

_frontends = _cli.lazy("npu_rec.scripts._frontends")

DEFAULT_EVICTION_SECS = 24 * 3600

flags.adopt_module_key_flags(F)


def _online(settings) -> None:
    settings.frontend = "keras"
    settings.incremental_checkpoint = True
    if settings.access_threshold < 0:
        settings.access_threshold = 0
    if settings.eviction_threshold < 0:
        settings.eviction_threshold = DEFAULT_EVICTION_SECS


def run() -> dict:
    """Runs online training as the flags say; returns the metrics."""
    settings, plan = settings_and_plan(_online, record_run=True)
    done = already_complete(settings)
    if done is not None:
        return done
    if settings.verbose:
        print(
            f"npu_rec: online training {settings.model} on {plan.name}, "
            f"model_dir={settings.model_dir}",
            flush=True,
        )
    metrics, log, _ = _frontends.run(settings, plan)
    return finish(settings, plan, metrics, log)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    F.check_now()
    if F.FRONTEND.value != "keras":
        raise app.UsageError(
            "online_train.py runs RecModel.online_train: --frontend must be "
            f"keras. Received: --frontend={F.FRONTEND.value}"
        )
    _cli.quiet_logs()
    run()


if __name__ == "__main__":
    _cli.run(main, __doc__)
