"""npu_rec: huge sparse recommendation models on TensorFlow 2 and Keras 3.

The Rec SDK (mx_rec) / npu_bridge programming model on standard TensorFlow:
sparse tables keyed by raw 64-bit ids, `npu_rec.init` settings, an Estimator
front end (`npu_rec.estimator`) and a Keras front end (`npu_rec.keras`).
"""

import importlib

__version__ = "0.1.0"

#: Public name -> the module defining it. They load on first use (PEP 562), so
#: `import npu_rec` and `python -m npu_rec.launch --help` do not import
#: TensorFlow. The installed TensorFlow and Keras versions are checked at import
#: (from the packages' metadata), or at the first name used when that is unknown.
_PUBLIC = {
    "ConfigError": "npu_rec._validation",
    "ConfigTypeError": "npu_rec._validation",
    "CpuBinding": "npu_rec._cpu",
    "RecConfig": "npu_rec._rec_config",
    "ResolvedSteps": "npu_rec.training._step_rules",
    "check_session_steps": "npu_rec.training._step_rules",
    "get_config": "npu_rec._rec_config",
    "get_cpu_binding": "npu_rec._cpu",
    "init": "npu_rec._rec_config",
    "shutdown": "npu_rec._rec_config",
    "LOOKUP_COLLECTION": "npu_rec.table._lookup",
    "LookupRecord": "npu_rec.table._lookup",
    "PreparedIds": "npu_rec.table._key_pipeline",
    "ShardedTable": "npu_rec.table._sharded",
    "SingleShardTable": "npu_rec.table._sparse",
    "SparseTable": "npu_rec.table._base",
    "TableConfig": "npu_rec.table._config",
    "TableInvariantError": "npu_rec.table._check",
    "apply_recorded_gradients": "npu_rec.table._lookup",
    "create_table": "npu_rec.table._create",
    "prepare_ids": "npu_rec.table._key_pipeline",
    "prepare_keys": "npu_rec.table._key_pipeline",
    "record_lookups": "npu_rec.table._lookup",
    "sparse_lookup": "npu_rec.table._lookup",
}
_checked = importlib.import_module("npu_rec._compat").check_installed_quietly()


def __getattr__(name: str):
    global _checked
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _checked and not name.startswith("_"):
        importlib.import_module("npu_rec._compat").check_installed()
        _checked = True
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name == "_table_registry":
        value = importlib.import_module("npu_rec.table._registry")
    else:
        try:  # a subpackage or module: npu_rec.table, npu_rec.optimizers, ...
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


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
