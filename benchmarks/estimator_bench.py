"""Samples/s of NPUEstimator training: float32 vs accelerated `fast1` vs `fast`, in one run.

Prints a table and writes JSON. Each accelerated mode runs `<mode>|step|0.9`
(90% of the steps in low precision, then float32). Without a GPU, `fast`
(float16 with dynamic loss scaling) runs Grappler's CPU emulation of the
float16 AMP pass: float16 numerics computed by float32 kernels plus casts, so
it measures the cost of that emulation, not a float16 speed-up.

    python benchmarks/estimator_bench.py --steps=300 --batch_size=256
"""

import json
import os
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_STEPS = flags.DEFINE_integer("steps", 300, "Training steps per mode.", lower_bound=10)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Batch size.", lower_bound=1)
_OUT = flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "estimator_bench.json"),
    "JSON output path.",
)


def _run(mode, steps, batch):
    from npu_rec import estimator as E
    from tests.estimator import models

    exp = (
        None
        if mode == "float32"
        else E.ExperimentalConfig(accelerate_train_mode=f"{mode}|step|0.9")
    )
    try:
        est = E.NPUEstimator(
            models.deepfm_model_fn,
            params={"hidden": (256, 128), "dim": 16},
            config=E.NPURunConfig(
                model_dir=tempfile.mkdtemp(),
                random_seed=1,
                experimental_config=exp,
                log_step_count_steps=None,
                save_checkpoints_steps=10**6,
            ),
        )
    except ValueError as error:
        return {"mode": mode, "error": str(error).split(".")[0]}
    input_fn = models.synthetic_input_fn(0, batch * 50, batch_size=batch, epochs=1000)
    start = time.perf_counter()  # graph building included
    est.train(input_fn, max_steps=steps)
    elapsed = time.perf_counter() - start
    return {
        "mode": mode,
        "steps": steps,
        "batch_size": batch,
        "seconds": elapsed,
        "samples_per_sec": steps * batch / elapsed,
        "low_precision_steps": sum(d != "float32" for _, d in est.precision_history),
    }


def main(argv):
    del argv
    rows = [_run(m, _STEPS.value, _BATCH.value) for m in ("float32", "fast1", "fast")]
    print(f"{'mode':8} {'samples/s':>10} {'low-precision steps':>20}  note")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:8} {'-':>10} {'-':>20}  {r['error']}")
        else:
            print(f"{r['mode']:8} {r['samples_per_sec']:10.0f} {r['low_precision_steps']:20d}")
    with open(_OUT.value, "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    app.run(main)
