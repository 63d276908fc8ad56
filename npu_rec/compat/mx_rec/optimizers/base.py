"""mx_rec.optimizers.base: `CustomizedOptimizer`, the base of every hash optimizer.

A hash optimizer is a `tf.compat.v1.train.Optimizer` whose `apply_gradients`
takes `(gradient, sparse variable)` pairs, the sparse variables being what
`get_dense_and_sparse_variable` (one per table: a lookup's unique-row tensor,
or the stand-in of a table looked up several times, whose gradient covers all
its lookups) or the `ASCEND_SPARSE_LOOKUP_*` collections (rows, unique keys)
hold. It binds itself
to each looked-up table (`npu_rec.SparseTable.bind_optimizer`) and applies
its per-row rule with `npu_rec.apply_recorded_gradients`.

The built-in optimizers use npu_rec's rules (`npu_rec.optimizers`). A program's
own subclass that implements `_apply_sparse_duplicate_indices(grad, var)` (as
a `tf.compat.v1` optimizer does) has it run on the table's rows: `var` is the
table's row variable and `grad.indices` the rows to update (slot-free rules
only).
"""

from __future__ import annotations

from collections import defaultdict

import tensorflow as tf

import npu_rec
from npu_rec import _compat
from npu_rec.compat.mx_rec.core.embedding import _TableLookups
from npu_rec.compat.mx_rec.util.initialize import ConfigInitializer
from npu_rec.estimator._sparse_train import APPLIED_COLLECTION
from npu_rec.optimizers import SparseOptimizer
from npu_rec.optimizers._sparse_optimizers import _check_learning_rate

__all__ = ["CustomizedOptimizer"]


class _ProgramRule(SparseOptimizer):
    """An npu_rec sparse optimizer running a program's `_apply_sparse_duplicate_indices`."""

    def __init__(self, owner):
        # `_learning_rate` is mx_rec's own convention: its optimizers and the programs'
        # subclasses keep their rate there.
        rate = getattr(owner, "_learning_rate", None)
        super().__init__(rate if rate is not None else 1.0, owner.get_name())
        if list(owner.get_slot_init_values() if hasattr(owner, "get_slot_init_values") else []):
            raise ValueError(
                f"Hash optimizer {owner!r} declares slots; npu_rec runs only slot-free "
                "program-defined rules. Use a built-in mx_rec optimizer module instead."
            )
        self.owner = owner

    def apply_sparse(self, values, slots, rows, grads, step, current=None):
        grad = tf.IndexedSlices(grads, rows, tf.shape(values, out_type=tf.int64))
        return _compat.v1_apply_sparse_rule(self.owner, grad, values)


class CustomizedOptimizer(tf.compat.v1.train.Optimizer):
    """Base class of mx_rec's hash optimizers (see the module docstring)."""

    name_counter: dict = defaultdict(int)

    def __init__(self, use_locking=False, name="CustomizedOptimizer"):
        super().__init__(use_locking, name)
        self._sparse: SparseOptimizer | None = None

    def _get_name(self, name="CustomizedOptimizer"):
        """Sets `unique_name` (name, then name_1, name_2, ...) as mx_rec does."""
        count = CustomizedOptimizer.name_counter[name]
        CustomizedOptimizer.name_counter[name] += 1
        self.base_name = name
        self.unique_name = name if count == 0 else f"{name}_{count}"

    @property
    def sparse_optimizer(self) -> SparseOptimizer:
        """The npu_rec per-row optimizer the tables are bound to."""
        if getattr(self, "_sparse", None) is None:
            self._sparse = _ProgramRule(self)
        return self._sparse

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Updates the tables of the given sparse variables; returns the op.

        Raises:
          ValueError: a variable is not a sparse variable of a training lookup
            in this graph, or a table already has another optimizer.
        """
        graph = tf.compat.v1.get_default_graph()
        by_ref = {}
        for rec in graph.get_collection(npu_rec.LOOKUP_COLLECTION):
            for t in (rec.embeddings, rec.rows, rec.keys):
                by_ref[t.ref()] = rec
        records, grads = [], []
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            table = _TableLookups.by_variable(graph, var) if isinstance(var, tf.Tensor) else None
            if table is not None:  # a table looked up several times: one gradient for all
                table.core.bind_optimizer(self.sparse_optimizer)
                records.extend(table.records)
                grads.extend(table.split(grad))
                continue
            rec = by_ref.get(var.ref()) if isinstance(var, tf.Tensor) else None
            if rec is None:
                raise ValueError(
                    "A hash optimizer updates sparse tables: each variable must be a sparse "
                    "variable of get_dense_and_sparse_variable() or of the "
                    "ASCEND_SPARSE_LOOKUP_* collections of this graph. "
                    f"Received: {var!r}"
                )
            rec.table.bind_optimizer(self.sparse_optimizer)
            records.append(rec)
            grads.append(grad)
        with tf.name_scope(name or self.get_name()):
            ops = [npu_rec.apply_recorded_gradients(records, grads)] if records else []
            for rec in records:
                graph.add_to_collection(APPLIED_COLLECTION, rec.embeddings.name)
            if global_step is not None:
                with tf.control_dependencies(ops):
                    return tf.compat.v1.assign_add(global_step, 1).op
            return tf.group(*ops)

    # A hash optimizer has no dense update.
    def _apply_dense(self, grad, var):
        raise NotImplementedError("Hash optimizers update sparse tables only.")


class _BuiltIn(CustomizedOptimizer):
    """A hash optimizer applying one of npu_rec's per-row rules.

    Its learning-rate fields `_lr` and `_learning_rate` (mx_rec's optimizers
    have them) are the rule's `learning_rate`: a program that scales them
    (the examples' loss-scale wrappers divide them by the loss scale) scales
    the update of the rows. Made, it is `ConfigInitializer`'s
    `optimizer_config.optimizer_instance`, as in mx_rec.
    """

    def __init__(self, sparse: SparseOptimizer, learning_rate, use_locking, name):
        del learning_rate  # the rule holds it
        self._get_name(name)
        super().__init__(use_locking, self.unique_name)
        self._sparse = sparse
        ConfigInitializer.get_instance().optimizer_config.optimizer_instance = self

    @property
    def _lr(self):
        return self._sparse.learning_rate

    @_lr.setter
    def _lr(self, value):
        self._sparse.learning_rate = _check_learning_rate(value)

    _learning_rate = _lr

    def __repr__(self):
        return f"{type(self).__name__}({self._sparse!r})"
