"""Runs the 2-worker Keras `fit` scenarios named on its command line, one after the other.

`keras_worker.py OUT SCENARIO...`, a SCENARIO being `tier` (`tier_worker.py`) or
`fallback` (`fallback_worker.py`). Run under `python -m npu_rec.launch --workers 2`
(each worker trains on its half of every global batch; worker 0 keeps the default
lookup path, the compiled kernels where they build, worker 1 takes the stock path,
`NPU_REC_KERNELS=off`, so each owner's lookups go through the other backend) or
alone (one process on the whole global batches). For each scenario it trains the
scenario's model one step per epoch, evaluates it, and writes
`<out>/<scenario>_<rank or single>.npz` (the per-step losses, the evaluation loss,
each table's state fields the scenario keeps, and on the workers what the scenario
inspects while both run) and saves the tables with `npu_rec.distribute.save_tables`
into `<out>/<scenario>_ckpt_<multi|single>`.
"""

import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MULTI = "TF_CONFIG" in os.environ
if MULTI and json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
    os.environ["NPU_REC_KERNELS"] = "off"  # worker 1: the stock path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if MULTI:  # before any other TensorFlow op
    import npu_rec.distribute  # noqa: E402

    STRATEGY = npu_rec.distribute.multi_worker_strategy(timeout_seconds=60)
else:
    STRATEGY = tf.distribute.get_strategy()

import npu_rec  # noqa: E402

RANK = npu_rec.distribute.worker_rank(STRATEGY) if MULTI else 0


def sharded(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` split by rows between the workers, repeated."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).repeat()


def run(name: str, out_dir: str) -> None:
    scenario = importlib.import_module(f"tests.distribute.{name}_worker")
    with STRATEGY.scope():
        model = scenario.build(out_dir, MULTI)
    history = model.fit(
        sharded(scenario.data()), epochs=scenario.STEPS, steps_per_epoch=1, verbose=0
    )
    result = {"loss": np.asarray(history.history["loss"])}
    if MULTI:  # both workers are alive here (the evaluation below needs them)
        result.update(scenario.inspect(model, out_dir))
    result["eval_loss"] = np.asarray(
        model.evaluate(sharded(scenario.data()), steps=scenario.EVAL_STEPS, verbose=0)
    )
    for table in model.tables:
        for field, value in table.read_state().items():
            if scenario.keep(field):
                value = np.asarray(value)  # bfloat16 rows as float32
                result[f"{table.name}/{field}"] = value.astype(
                    np.float32 if value.dtype.kind == "V" else value.dtype
                )
    npu_rec.distribute.save_tables(
        os.path.join(out_dir, f"{name}_ckpt_{'multi' if MULTI else 'single'}"),
        model.tables,
        scenario.STEPS,
    )
    np.savez(os.path.join(out_dir, f"{name}_{RANK if MULTI else 'single'}.npz"), **result)


if __name__ == "__main__":
    for scenario_name in sys.argv[2:]:
        run(scenario_name, sys.argv[1])
    print(f"done {RANK if MULTI else 'single'}", flush=True)
