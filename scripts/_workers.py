"""The scripts under `python -m npu_rec.launch` (or any `TF_CONFIG` with several workers).

`setup()` runs first in a script's `main`, before any TensorFlow op: with a
`TF_CONFIG` naming more than one worker it creates the multi-worker strategy
(every table built in `scope()` is then sharded across the workers). The other
functions are no-ops in one process:

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


def setup():
    """Creates the multi-worker strategy when `TF_CONFIG` names several workers; returns it."""
    global _STRATEGY
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster = config.get("cluster", {})
    workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    if _STRATEGY is None and workers > 1:
        if cluster.get("ps"):
            raise SystemExit(
                "npu_rec: `ps` tasks (the Estimator's parameter-server route) are "
                "not supported by the scripts yet; launch workers only."
            )
        import npu_rec.distribute  # noqa: PLC0415

        _STRATEGY = npu_rec.distribute.multi_worker_strategy()
    return _STRATEGY


def active() -> bool:
    return _STRATEGY is not None


def shard() -> tuple[int, int]:
    """(number_of_workers, worker_rank) of this process ((1, 0) in one process)."""
    if _STRATEGY is None:
        return 1, 0
    import npu_rec.distribute  # noqa: PLC0415

    return _STRATEGY.num_replicas_in_sync, npu_rec.distribute.worker_rank(_STRATEGY)


def model_dir(directory: str) -> str:
    """This worker's directory under `directory` (`directory` itself in one process)."""
    workers, rank = shard()
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
    """Several workers train the Keras front end only (for now)."""
    if _STRATEGY is not None and frontend != "keras":
        raise SystemExit(
            f"npu_rec: --frontend={frontend} cannot run on several workers yet; "
            "use --frontend=keras (docs/distributed.md)."
        )
