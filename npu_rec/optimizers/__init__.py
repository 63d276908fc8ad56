"""Sparse optimizers for npu_rec tables (`SGD`, `Adagrad`, `RowWiseAdagrad`, lazy `Adam`, `Ftrl`).

Also the Rec SDK names `SGDByAddr`, `LazyAdam`, `LazyAdamByAddress`,
`create_hash_optimizer` and `create_hash_optimizer_by_address`.
"""

from npu_rec.optimizers._sparse_optimizers import (
    SGD,
    Adagrad,
    Adam,
    Ftrl,
    LazyAdam,
    LazyAdamByAddress,
    RowWiseAdagrad,
    SGDByAddr,
    SparseOptimizer,
    create_hash_optimizer,
    create_hash_optimizer_by_address,
)

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "Ftrl",
    "LazyAdam",
    "LazyAdamByAddress",
    "RowWiseAdagrad",
    "SGDByAddr",
    "SparseOptimizer",
    "create_hash_optimizer",
    "create_hash_optimizer_by_address",
]
