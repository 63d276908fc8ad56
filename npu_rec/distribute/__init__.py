"""Multi-worker training: sparse tables sharded by key hash across the workers.

Under `tf.distribute.MultiWorkerMirroredStrategy` (one process per worker,
`TF_CONFIG` set, e.g. by `python -m npu_rec.launch`), every table created in
the strategy's scope (`npu_rec.create_table`, `npu_rec.keras.SparseEmbedding`)
is a `WorkerShardedTable`: each worker owns the keys that hash to it, and a
training step exchanges ids, rows and gradients with the other workers. The
dense part is mirrored and trained by the Keras optimizer. See
docs/distributed.md.
"""

from npu_rec.distribute._checkpoint import (
    merge_states,
    restore_chains,
    restore_tables,
    save_tables,
)
from npu_rec.distribute._exchange import (
    DEFAULT_TIMEOUT_SECONDS,
    Exchange,
    NotInReplicaStepError,
    communication_options,
)
from npu_rec.distribute._faults import PEER_ERRORS, WorkerLostError, lost_tasks
from npu_rec.distribute._faults import explain as explain_peer_error
from npu_rec.distribute._strategy import multi_worker_strategy, worker_rank
from npu_rec.distribute._worker_table import WorkerShardedTable, updates_only_when

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "PEER_ERRORS",
    "Exchange",
    "NotInReplicaStepError",
    "WorkerLostError",
    "WorkerShardedTable",
    "communication_options",
    "explain_peer_error",
    "lost_tasks",
    "merge_states",
    "multi_worker_strategy",
    "restore_chains",
    "restore_tables",
    "save_tables",
    "updates_only_when",
    "worker_rank",
]
