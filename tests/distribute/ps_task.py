"""One task of the Estimator parameter-server scenario (run by `npu_rec.launch`).

`ps_task.py <dir> <die_at>`: every task builds the same `NPUEstimator` over the
DeepFM reference `model_fn` on an easy `SyntheticSource` (its own share per
trainer) and calls `train_and_evaluate`: the ps tasks serve, the chief and the
workers train asynchronously to `STEPS` with checkpoints every `SAVE` steps, the
evaluator evaluates each new checkpoint. Each task prints `FINISHED <task> <result>`.

* worker 1 kills itself (SIGKILL) after global step `die_at` (0 = never) when
  `<dir>/died` does not exist yet (it creates it first), once the chief has
  saved a checkpoint;
* the workers slow down from step `SAVE` until the chief's first checkpoint (`_Pace`);
* the workers stop `SOLO` steps before the end, so the chief's last steps run
  alone: at its end the ps state is what its final checkpoint saves;
* the chief writes `<dir>/chief.json`: the step it resumed from, the device of
  every table resource and of every dense variable, the names of the tensors
  crossing between tasks in its first step, and one batch of
  features with the probabilities the cluster computes for them at its end;
* rows are numbered (`NumberedSource`, stream `row`): the training op counts
  how often each row was trained in a variable `rows_trained` of the checkpoint.
"""

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from npu_rec import estimator as E  # noqa: E402
from npu_rec.data import SyntheticCriteo, SyntheticSource, as_input_fn  # noqa: E402
from npu_rec.data._convert import column_streams  # noqa: E402
from npu_rec.data._synthetic import BLOCK_ROWS, CATEGORICAL_NAMES, DENSE_NAMES  # noqa: E402
from npu_rec.models import estimator_model_fn, specs_for  # noqa: E402

STEPS, SAVE, SOLO, BATCH = 60, 10, 4, 128
PACE_SECS = 1.0
FEATURES = list(CATEGORICAL_NAMES)
DENSE = list(DENSE_NAMES)
PROBE = "ps_task_probe"


DATA = dict(seed=5, vocab_sizes=(40,) * 26, signal=3.0)
EVAL_START = 10_000_000  # held-out rows: the trainers read rows from 0


MAX_ROWS = 1 << 16  # more than the trainers read in both runs


class NumberedSource(SyntheticSource):
    """`SyntheticSource` rows with their index as an int64 stream `row`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._streams = column_streams("label", DENSE_NAMES, CATEGORICAL_NAMES + ("row",), ())

    def _block(self, index):
        rows = super()._block(index)
        if "row" not in rows:
            rows["row"] = np.arange(index * BLOCK_ROWS, (index + 1) * BLOCK_ROWS, dtype=np.int64)
        return rows


def source():
    return NumberedSource(num_rows=None, **DATA)


def model_fn():
    base = estimator_model_fn(
        "deepfm",
        specs_for(FEATURES, table_name="categorical"),
        DENSE,
        embedding_dim=4,
        learning_rate=0.03,
        seed=1,
        hidden_units=(8,),
    )

    def fn(features, labels, mode, params, config):
        rows = features.pop("row", None)
        spec = base(features, labels, mode, params, config)
        if mode == E.ModeKeys.TRAIN:
            tf.compat.v1.add_to_collection(PROBE, spec.predictions["probabilities"])
            for name in FEATURES + DENSE:
                tf.compat.v1.add_to_collection(PROBE, features[name])
            trained = tf.compat.v1.Variable(
                tf.zeros([MAX_ROWS], tf.int32), trainable=False, name="rows_trained"
            )
            count = tf.compat.v1.scatter_add(trained, rows, tf.ones_like(rows, tf.int32))
            spec = spec._replace(train_op=tf.group(spec.train_op, count))
        return spec

    return fn


def select(features, label):
    return {k: features[k] for k in FEATURES + DENSE}, label


def input_fn(config):
    """This trainer's share (its `source` and `reading_position` tracked by the Estimator)."""
    trainers, rank = config.num_worker_replicas, config.global_id_in_cluster or 0
    return as_input_fn(source(), BATCH, number_of_workers=trainers, worker_rank=rank)


def eval_input_fn():
    rows = SyntheticCriteo(**DATA).rows(EVAL_START, EVAL_START + 1024)
    label = rows.pop("label").astype("float32")
    return tf.data.Dataset.from_tensor_slices((rows, label)).batch(256).map(select)


class _Die(tf.compat.v1.train.SessionRunHook):
    def __init__(self, directory, at):
        self.marker, self.at = os.path.join(directory, "died"), at

    def begin(self):
        self.step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        if self.at and run_context.session.run(self.step) >= self.at:
            # Not before the chief's first checkpoint (checked at each step: a hook that
            # blocked here would keep this worker from acknowledging the chief's pause).
            saved = tf.train.latest_checkpoint(os.path.dirname(self.marker)) is not None
            if saved and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                print(f"DIE {time.time()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)


class _Pace(tf.compat.v1.train.SessionRunHook):
    """A worker slows down from step `SAVE` until the chief's first checkpoint.

    Without it the workers train most steps before the chief's first one, and the
    kill would come after the last checkpoint: nothing would be left to resume.
    It sleeps `PACE_SECS` after each step rather than blocking until the
    checkpoint: a blocked worker would not acknowledge the chief's pause for it.
    """

    def __init__(self, directory):
        self.directory, self.saved = directory, False

    def begin(self):
        self.step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        if not self.saved and run_context.session.run(self.step) >= SAVE:
            self.saved = tf.train.latest_checkpoint(self.directory) is not None
            time.sleep(0 if self.saved else PACE_SECS)


class _StopBefore(tf.compat.v1.train.SessionRunHook):
    """A worker stops `SOLO` steps before the end (the chief ends alone)."""

    def begin(self):
        self.step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values):
        if run_context.session.run(self.step) >= STEPS - SOLO:
            run_context.request_stop()


def _task(device: bytes) -> str:
    return device.decode().split("/device:")[0]


class _Probe(tf.compat.v1.train.SessionRunHook):
    """The chief's report: placement, what crosses between tasks in a step, and the
    cluster's predictions at its end."""

    def __init__(self, directory, start):
        self.path, self.start = os.path.join(directory, "chief.json"), start
        self.crossing = None

    def before_run(self, run_context):
        if self.crossing is not None:
            return None
        options = tf.compat.v1.RunOptions(output_partition_graphs=True)
        return tf.compat.v1.train.SessionRunArgs(None, options=options)

    def after_run(self, run_context, run_values):
        graphs = run_values.run_metadata.partition_graphs
        if self.crossing is None and graphs:
            # The tensors crossing between tasks: a `_Recv` in the receiving partition.
            self.crossing = [
                node.attr["tensor_name"].s.decode()
                for graph in graphs
                for node in graph.node
                if node.op in ("_Recv", "_HostRecv")
                and _task(node.attr["send_device"].s) != _task(node.attr["recv_device"].s)
            ]

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self.tensors = tf.compat.v1.get_collection(PROBE)
        kinds = (
            "VarHandleOp",
            "MutableDenseHashTableV2",
            "NpuRecKeyMap",
            "MutableHashTableV2",
            "MutexV2",
        )
        self.devices = {op.name: op.device for op in graph.get_operations() if op.type in kinds}

    def end(self, session):
        values = session.run(self.tensors)
        report = {
            "start": self.start,
            "devices": self.devices,
            "probabilities": values[0].tolist(),
            "features": {n: v.tolist() for n, v in zip(FEATURES + DENSE, values[1:], strict=True)},
            "step": int(session.run(tf.compat.v1.train.get_global_step())),
            "crossing": self.crossing,
        }
        with open(self.path, "w") as f:
            json.dump(report, f)


def main(directory: str, die_at: int) -> None:
    config = E.NPURunConfig(
        model_dir=directory,
        save_checkpoints_steps=SAVE,
        keep_checkpoint_max=0,
        log_step_count_steps=None,
        save_summary_steps=0,
    )
    est = E.NPUEstimator(model_fn(), config=config)
    hooks = []
    if config.task_type == "worker":
        hooks = [_Pace(directory), _StopBefore()]
        hooks += [_Die(directory, die_at)] if config.task_id == 1 else []
    elif config.task_type == "chief":
        latest = est.latest_checkpoint()
        hooks = [_Probe(directory, 0 if latest is None else int(latest.rsplit("-", 1)[1]))]
    train = E.TrainSpec(input_fn(config), max_steps=STEPS, hooks=hooks)
    result, _ = E.train_and_evaluate(est, train, E.EvalSpec(eval_input_fn, steps=4))
    if result is not None:  # the evaluator's last evaluation
        result = {k: float(v) for k, v in result.items()}
    print(f"FINISHED {config.task_type}:{config.task_id} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
