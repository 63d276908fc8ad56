"""The scripts under `python -m npu_rec.launch` (or any `TF_CONFIG` with several workers).

`setup()` runs first in a script's `main`, before any TensorFlow op: with a
`TF_CONFIG` naming more than one worker it creates the multi-worker strategy
(every table built in `scope()` is then sharded across the workers). With `ps`
tasks in `TF_CONFIG` it creates nothing: that is the Estimator's parameter-server
route (`--frontend=estimator`), where `NPUEstimator` itself reads `TF_CONFIG`;
`role()` then names this task (chief, worker, ps, evaluator), every task shares
`--model_dir` (the chief writes it) and each trainer reads its own share of the
data. The other functions are no-ops in one process:

* `model_dir(d)`: each worker keeps its own checkpoints, run record and metrics in
  `d/worker-<rank>-of-<W>` (the dense state is the same in all; the tables and the
  data position are the worker's own), so the same command resumes every worker;
* `shard()`: `(number_of_workers, worker_rank)` for the data source: each worker
  reads its own share, `--batch_size` samples per step (a global batch of
  W x `--batch_size`);
* `distribute(ds)`: hands a worker's own dataset to the strategy (no re-batching).
"""

from __future__ import annotations

import contextlib
import json
import os

_STRATEGY = None
#: The ps route's task: ("chief" | "worker" | "ps" | "evaluator", index, trainers), or None.
_PS_TASK = None


def setup():
    """Creates the multi-worker strategy when `TF_CONFIG` names several workers; returns it.

    With `ps` tasks in `TF_CONFIG` (the Estimator route) it records the task instead.
    """
    global _STRATEGY, _PS_TASK
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster = config.get("cluster", {})
    workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    if cluster.get("ps"):
        if len(cluster.get("chief", [])) != 1:
            raise SystemExit(
                "npu_rec: with ps tasks (the Estimator route) the cluster needs one chief "
                "task: launch with --chief. Received: TF_CONFIG cluster jobs "
                f"{sorted(cluster)}"
            )
        task = config.get("task", {})
        _PS_TASK = (task.get("type"), int(task.get("index", 0)), workers)
    elif _STRATEGY is None and workers > 1:
        import npu_rec.distribute  # noqa: PLC0415

        _STRATEGY = npu_rec.distribute.multi_worker_strategy()
    return _STRATEGY


def active() -> bool:
    return _STRATEGY is not None


def role() -> str | None:
    """This task's type on the ps route ("chief", "worker", "ps", "evaluator"), else None."""
    return None if _PS_TASK is None else _PS_TASK[0]


def writes_files() -> bool:
    """Whether this process writes the run record and metrics (not a ps-route helper task)."""
    return role() in (None, "chief")


def shard() -> tuple[int, int]:
    """(number_of_workers, worker_rank) of this process ((1, 0) in one process).

    On the ps route: the trainers (chief first, then the workers) share the data.
    """
    if _PS_TASK is not None:
        job, index, trainers = _PS_TASK
        if job == "chief":
            return trainers, 0
        if job == "worker":
            return trainers, 1 + index
        return 1, 0
    if _STRATEGY is None:
        return 1, 0
    import npu_rec.distribute  # noqa: PLC0415

    return _STRATEGY.num_replicas_in_sync, npu_rec.distribute.worker_rank(_STRATEGY)


def model_dir(directory: str) -> str:
    """This worker's directory under `directory` (`directory` itself in one process).

    On the ps route every task shares `directory` (the chief writes it).
    """
    workers, rank = shard()
    if _PS_TASK is not None:
        return directory
    return directory if workers == 1 else os.path.join(directory, f"worker-{rank}-of-{workers}")


def scope():
    """The strategy's scope (a null context in one process)."""
    return _STRATEGY.scope() if _STRATEGY is not None else contextlib.nullcontext()


def distribute(dataset):
    """`dataset` (this worker's own batches) as the strategy's input; unchanged in one process."""
    if _STRATEGY is None:
        return dataset
    return _STRATEGY.distribute_datasets_from_function(lambda context: dataset)


def check_frontend(frontend: str) -> None:
    """Workers only: the Keras front end; with ps tasks: the Estimator front end."""
    if _STRATEGY is not None and frontend != "keras":
        raise SystemExit(
            f"npu_rec: --frontend={frontend} cannot run on workers without ps tasks; "
            "use --frontend=keras, or add ps tasks and a chief (docs/distributed.md)."
        )
    if _PS_TASK is not None and frontend != "estimator":
        raise SystemExit(
            f"npu_rec: --frontend={frontend} cannot run with ps tasks; use "
            "--frontend=estimator, or launch workers only (docs/distributed.md)."
        )
