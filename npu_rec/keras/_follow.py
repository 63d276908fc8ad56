"""Tables without a sparse optimizer of their own follow the compiled Keras optimizer.

`SparseEmbedding("item", 16)` (no `optimizer=`) inside a `RecModel` is trained
by the sparse counterpart of the optimizer the model is compiled with, with
its hyperparameters and the same learning rate (a schedule is evaluated at the
table's own update count, which advances with the optimizer's iterations; a
constant rate is read from the Keras optimizer at every step, so
`ReduceLROnPlateau` and `LearningRateScheduler` reach the tables too):

    keras.optimizers.SGD (no momentum)  -> npu_rec.optimizers.SGD
    keras.optimizers.Adagrad            -> npu_rec.optimizers.Adagrad
    keras.optimizers.Adam / AdamW       -> npu_rec.optimizers.Adam (lazy: rows of the batch)
    keras.optimizers.Ftrl (beta 0, no shrinkage) -> npu_rec.optimizers.Ftrl

Any other optimizer has no sparse counterpart: `compile` raises naming the
layer. A table stays frozen only when its layer says so (`trainable=False`).
Gradient clipping, weight decay and EMA of the Keras optimizer apply to the
dense weights only.
"""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from npu_rec import _log as logging
from npu_rec import optimizers

#: Sparse optimizer made by `sparse_counterpart` -> the Keras optimizer it follows.
_FOLLOWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_COUNTERPARTS = (
    "SGD without momentum -> npu_rec.optimizers.SGD, Adagrad -> Adagrad, "
    "Adam/AdamW -> lazy Adam (amsgrad=False), Ftrl (beta=0, no l2 shrinkage) -> Ftrl"
)


class CompiledRate:
    """The learning rate of a Keras optimizer, read at every sparse update."""

    def __init__(self, optimizer: keras.optimizers.Optimizer):
        self.optimizer = optimizer

    def __call__(self, step):
        del step  # the Keras optimizer's rate is a variable (callbacks may change it)
        return self.optimizer.learning_rate

    def __repr__(self) -> str:
        return f"<learning rate of the compiled {type(self.optimizer).__name__}>"


def _inner(optimizer):
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _rate(optimizer, config):
    rate = config["learning_rate"]
    if isinstance(rate, dict):  # a serialised LearningRateSchedule: a copy of it
        try:
            return keras.optimizers.schedules.deserialize(rate)
        except (TypeError, ValueError):  # a plain callable: read through the optimizer
            pass
    return CompiledRate(optimizer)


def sparse_counterpart(optimizer) -> optimizers.SparseOptimizer | None:
    """The sparse optimizer a table follows under Keras `optimizer`, or None (no counterpart)."""
    optimizer = _inner(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return None
    with tf.init_scope():  # also from inside the first trace of the train step
        c = optimizer.get_config()
    name = f"{c['name']}_sparse"
    if isinstance(optimizer, keras.optimizers.SGD):
        if c["momentum"] or c["nesterov"]:
            return None
        sparse = optimizers.SGD(_rate(optimizer, c), name=name)
    elif isinstance(optimizer, keras.optimizers.Adagrad):
        sparse = optimizers.Adagrad(
            _rate(optimizer, c),
            initial_accumulator_value=c["initial_accumulator_value"],
            epsilon=c["epsilon"],
            name=name,
        )
    elif isinstance(optimizer, keras.optimizers.Adam):  # AdamW too
        if c["amsgrad"]:
            return None
        sparse = optimizers.Adam(
            _rate(optimizer, c),
            beta_1=c["beta_1"],
            beta_2=c["beta_2"],
            epsilon=c["epsilon"],
            name=name,
        )
    elif isinstance(optimizer, keras.optimizers.Ftrl):
        if c["beta"] or c["l2_shrinkage_regularization_strength"]:
            return None
        sparse = optimizers.Ftrl(
            _rate(optimizer, c),
            learning_rate_power=c["learning_rate_power"],
            initial_accumulator_value=c["initial_accumulator_value"],
            l1=c["l1_regularization_strength"],
            l2=c["l2_regularization_strength"],
            name=name,
        )
    else:
        return None
    _FOLLOWS[sparse] = optimizer
    return sparse


def follows_compiled(optimizer) -> bool:
    """True for a sparse optimizer made by `sparse_counterpart` (not the user's own)."""
    return optimizer in _FOLLOWS if optimizer is not None else False


def check(owner: str, table_name: str, optimizer) -> None:
    """Raises the error of `bind` when `optimizer` has no sparse counterpart."""
    if sparse_counterpart(optimizer) is None:
        raise ValueError(
            f"{owner} (table {table_name!r}) has no sparse optimizer of its own, so it "
            f"follows the compiled optimizer, and {type(_inner(optimizer)).__name__} has no "
            f"sparse counterpart ({_COUNTERPARTS}). Pass optimizer=npu_rec.optimizers.<SGD|"
            "Adagrad|Adam|Ftrl>(...) to the layer (or create_table), compile with one of "
            f"those, or freeze the table with trainable=False. Received: "
            f"optimizer={_describe(optimizer)}"
        )


def bind(owner: str, table, optimizer) -> None:
    """Gives `table` (looked up by `owner`) the counterpart of the compiled `optimizer`.

    A table with an optimizer of its own is left alone; one that follows an
    earlier compile follows the new optimizer when the counterpart is the same
    kind, else raises. The binding is logged once.

    Args:
      owner: Who looks the table up, for messages: "SparseEmbedding 'item_embedding'".
      table: The `SparseTable`.
      optimizer: The model's compiled Keras optimizer.

    Raises:
      ValueError: `optimizer` has no sparse counterpart, or the table follows
        an optimizer of another kind from an earlier compile.
    """
    own = table.optimizer
    if own is not None and not follows_compiled(own):
        return
    check(owner, table.name, optimizer)
    sparse = sparse_counterpart(optimizer)
    received = type(_inner(optimizer)).__name__
    if own is not None:
        if type(own) is not type(sparse) or own.slot_specs != sparse.slot_specs:
            raise ValueError(
                f"{owner} (table {table.name!r}) follows the "
                f"{type(_FOLLOWS[own]).__name__} of an earlier compile (sparse "
                f"{type(own).__name__}, whose slots the table holds) and cannot switch to the "
                f"counterpart of {received}. Give it an optimizer of its own or compile with "
                f"the same kind of optimizer. Received: optimizer={_describe(optimizer)}"
            )
        own.__dict__.update(vars(sparse))  # same slots: take the new hyperparameters
        _FOLLOWS[own] = _FOLLOWS[sparse]
        return
    table.bind_optimizer(sparse)
    logging.info(
        "npu_rec: %s (table %r) has no optimizer of its own; it follows the compiled %s as "
        "%r (dense-only settings such as clipping or weight decay do not apply to it).",
        owner,
        table.name,
        received,
        sparse,
    )


def _describe(optimizer) -> str:
    return f"{type(optimizer).__module__.split('.')[0]}.optimizers.{type(optimizer).__name__}"
