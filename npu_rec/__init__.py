"""npu_rec: huge sparse recommendation models on TensorFlow 2 and Keras 3.

The Rec SDK (mx_rec) / npu_bridge programming model on standard TensorFlow:
sparse tables keyed by raw 64-bit ids, `npu_rec.init` settings, an Estimator
front end (`npu_rec.estimator`) and a Keras front end (`npu_rec.keras`).
"""

from npu_rec import _compat

_compat.check_installed()

from npu_rec import checkpoint, optimizers  # noqa: E402  (F401)
from npu_rec.table import _registry as _table_registry  # noqa: E402, F401
from npu_rec.table._base import SparseTable  # noqa: E402
from npu_rec.table._check import TableInvariantError  # noqa: E402
from npu_rec.table._config import TableConfig  # noqa: E402
from npu_rec.table._create import create_table  # noqa: E402
from npu_rec.table._key_pipeline import PreparedIds, prepare_ids, prepare_keys  # noqa: E402
from npu_rec.table._lookup import (  # noqa: E402
    LOOKUP_COLLECTION,
    LookupRecord,
    apply_recorded_gradients,
    record_lookups,
    sparse_lookup,
)
from npu_rec.table._sharded import ShardedTable  # noqa: E402
from npu_rec.table._sparse import SingleShardTable  # noqa: E402

__version__ = "0.1.0"

from npu_rec._config import RecConfig, get_config, init, shutdown  # noqa: E402
from npu_rec._cpu import CpuBinding, get_cpu_binding  # noqa: E402
from npu_rec._validation import ConfigError, ConfigTypeError  # noqa: E402
from npu_rec.training._steps import ResolvedSteps, check_session_steps  # noqa: E402

__all__ = [
    "__version__",
    # Framework initialisation (npu_rec.init and its settings).
    "ConfigError",
    "ConfigTypeError",
    "CpuBinding",
    "RecConfig",
    "ResolvedSteps",
    "check_session_steps",
    "get_config",
    "get_cpu_binding",
    "init",
    "shutdown",
    # Sparse-table core.
    "LOOKUP_COLLECTION",
    "LookupRecord",
    "PreparedIds",
    "ShardedTable",
    "SingleShardTable",
    "SparseTable",
    "TableConfig",
    "TableInvariantError",
    "apply_recorded_gradients",
    "checkpoint",
    "create_table",
    "optimizers",
    "prepare_ids",
    "prepare_keys",
    "record_lookups",
    "sparse_lookup",
]
