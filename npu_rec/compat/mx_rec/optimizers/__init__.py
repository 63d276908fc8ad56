"""mx_rec.optimizers: hash (sparse-table) optimizers as `tf.compat.v1.train.Optimizer`s.

Each module's `create_hash_optimizer...` returns the optimizer the module
names, applied by npu_rec's per-row optimizers (`npu_rec.optimizers`).
"""
