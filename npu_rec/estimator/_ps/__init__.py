"""The Estimator's parameter-server route, in one place (docs/distributed.md, "The Estimator route").

On a `TF_CONFIG` cluster with `ps` tasks, `NPUEstimator.train` and
`train_and_evaluate` run tf.estimator's between-graph replication: the ps
tasks hold the dense variables and the tables' shards and serve until every
trainer has finished; the chief and the workers train asynchronously; the
evaluator evaluates each new checkpoint. The rest of the Estimator reaches the
route only through the names of this package:

* `ClusterInfo` and the task types: `TF_CONFIG` read as tf.estimator's
  `RunConfig` read it (`NPURunConfig`'s cluster properties);
* `check_trainable(config)` and `serve(config)`: what a ps task's `train()`
  does, and what the route refuses before training;
* `trainer_for(config)`: the chief's or a worker's `Trainer` (None in one
  process), whose methods place the graph (`placement`), give the trainer's
  reading position hook (`position_hook`), open its session (`session`),
  pause the workers around the chief's saves (`paused`) and end its part of
  the job (`done`);
* `evaluate_checkpoints(...)`: the evaluator task's loop.

Modules: `_cluster` (`TF_CONFIG`), `_tasks` (each task's part), `_servers`
(servers, dense placement, session filters, the end of the job), `_pause`
(the chief's pause barrier), `_position` (each trainer's reading position).
The table side, the tables' shards on the ps tasks, is
`npu_rec.distribute._ps`, which `npu_rec.create_table` reads.
"""

from npu_rec.estimator._ps._cluster import CHIEF, EVALUATOR, PS, WORKER, ClusterInfo
from npu_rec.estimator._ps._tasks import (
    Trainer,
    check_trainable,
    evaluate_checkpoints,
    serve,
    trainer_for,
)

__all__ = [
    "CHIEF",
    "EVALUATOR",
    "PS",
    "WORKER",
    "ClusterInfo",
    "Trainer",
    "check_trainable",
    "evaluate_checkpoints",
    "serve",
    "trainer_for",
]
