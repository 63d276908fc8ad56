"""The one place npu_rec touches private Keras 3 APIs (`keras.src...`, `_`-names).

Keras makes no promise about these; each is used because the public API has no
equivalent:

* `Functional`, `functional_init_arguments`, `Trainer`: `RecModel` is a
  subclassed model that also accepts the functional form
  `RecModel(inputs, outputs)` (Keras' own `Model.__new__` does the same).
* `object_registration.GLOBAL_CUSTOM_NAMES`: the functional variant of a
  registered `RecModel` subclass saves under the subclass' registered name.
* `Layer._flatten_layers`: every nested layer of a model, in a stable order
  (the sparse tables of a model; the layers `amp_level` casts).
* `Model._maybe_symbolic_build`, `Model._symbolic_build`,
  `Model._loss_tracker`, `Model._distribute_strategy`: `RecModel` overrides
  the first (it builds its state once, from the data's element spec, before
  tracing), calls the second, reports its loss into the third and reads the
  fourth (the strategy the model was created under, None without one: the
  public `distribute_strategy` falls back to the default strategy).
* `TFEpochIterator._distributed_dataset`: the element spec of the data `fit`
  iterates, which that build needs (`iterator_element_spec`).
* `Functional._inputs_struct`: a functional model's inputs in the structure
  they were given (a dict stays a dict), for serving signatures (`inputs_struct`).
* `KerasTensor._keras_history`: the layer that produced a model's output
  (`producing_layer`), kept float32 by `amp_level`.
* `Layer._trackable_children` (TensorFlow's `Trackable` hook): `SparseEmbedding`
  overrides it to refuse `tf.saved_model.save` with a message that says what
  to use instead.
* `losses.loss.unscale_loss_for_distribution`: under a multi-worker strategy
  Keras divides a compiled loss by the replica count; `RecModel` reports each
  replica's own batch loss (`npu_rec.keras._keras_fixes`).
* `Optimizer._all_reduce_sum_gradients` (the TensorFlow backend's): under a
  multi-worker strategy `RecModel`'s training step all-reduces the dense
  gradients itself, in one all-reduce with the step's logs, and applies them
  with this reduction skipped (`gradients_already_reduced`, also for the inner
  optimizer of a `LossScaleOptimizer`): the optimizer's `apply_gradients`
  calls it on the (gradient, variable) pairs and applies what it returns.
* `Model.train_function`'s contract with `fit`: `fit` calls
  `make_train_function()`, then `train_function(iterator)` once per step with
  the epoch's iterator (a `tf.data.Iterator` or a distributed one), takes the
  logs it returns, and ends the epoch on `StopIteration` or
  `tf.errors.OutOfRangeError`. Under a multi-worker strategy `RecModel` makes
  its own train function (`strategy.run` of its step, the logs taken as the
  step already reduced them) instead of Keras', which reduces every log with
  two more all-reduces.
* `backend.common.global_state` (optional: the Estimator works without it):
  the layer-name counters, reset per Estimator graph (`npu_rec.estimator._keras_names`).

`REQUIRED` lists them (`HOOKS`: the ones npu_rec overrides);
`tests/test_keras_private.py` fails, naming the installed Keras version and
the missing names, when a release drops one, checks what each accessor below
returns on real Keras objects, and walks npu_rec's source for private names
used outside this module and `npu_rec._compat` (TensorFlow's).
"""

from __future__ import annotations

import contextlib
import importlib

import keras
from keras.src.backend.tensorflow.trainer import TFEpochIterator
from keras.src.losses.loss import unscale_loss_for_distribution
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments
from keras.src.saving import object_registration
from keras.src.trainers.trainer import Trainer

try:
    from keras.src.backend.common import global_state
except ImportError:  # a Keras 3 release that moved it: see `has_global_state()`
    global_state = None

__all__ = [
    "HOOKS",
    "INSTANCE_HOOKS",
    "REQUIRED",
    "Functional",
    "TFEpochIterator",
    "Trainer",
    "flatten_layers",
    "functional_init_arguments",
    "global_state",
    "gradients_already_reduced",
    "has_global_state",
    "inputs_struct",
    "iterator_element_spec",
    "loss_tracker",
    "missing",
    "object_registration",
    "producing_layer",
    "register_functional_name",
    "strategy_of",
    "symbolic_build",
    "unscale_loss_for_distribution",
]

#: Private Keras methods npu_rec's classes override (each is also in `REQUIRED`).
#: `Optimizer._all_reduce_sum_gradients` is replaced on an optimizer instance, for the
#: length of a traced step (`gradients_already_reduced`), not by a subclass.
HOOKS = (
    "Model._maybe_symbolic_build",
    "Layer._trackable_children",
    "Optimizer._all_reduce_sum_gradients",
)

#: The entries of `HOOKS` replaced on instances rather than overridden by a class.
INSTANCE_HOOKS = ("Optimizer._all_reduce_sum_gradients",)

#: (module, attribute path) of every private Keras name npu_rec relies on.
REQUIRED = (
    ("keras.src.models.functional", "Functional"),
    ("keras.src.losses.loss", "unscale_loss_for_distribution"),
    ("keras.src.models.model", "functional_init_arguments"),
    ("keras.src.saving.object_registration", "GLOBAL_CUSTOM_NAMES"),
    ("keras", "Model._maybe_symbolic_build"),
    ("keras", "Model._symbolic_build"),
    ("keras", "Model._flatten_layers"),
    ("keras", "Layer._trackable_children"),
    ("keras", "Optimizer._all_reduce_sum_gradients"),
    ("keras", "Model.make_train_function"),
    ("keras.src.backend.tensorflow.trainer", "TFEpochIterator"),
    ("keras.src.ops.node", "KerasHistory.operation"),
    ("keras.src.backend.common.global_state", "get_global_attribute"),
    ("keras.src.backend.common.global_state", "set_global_attribute"),
)


def missing() -> list[str]:
    """The entries of `REQUIRED` this Keras does not have ("module:attr")."""
    out = []
    for module, path in REQUIRED:
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            out.append(f"{module}:{path}")
    return out


def flatten_layers(model, include_self: bool = True) -> list:
    """Every layer nested in `model` (recursively), in Keras' stable order."""
    return list(model._flatten_layers(include_self=include_self, recursive=True))


def loss_tracker(model):
    """The `keras.metrics.Mean` in which a Keras model reports its loss."""
    return model._loss_tracker


def symbolic_build(model, data_batch) -> None:
    """Keras' own build of a model's optimizer, loss and metric state from a batch's spec."""
    model._symbolic_build(data_batch=data_batch)


def strategy_of(model):
    """The `tf.distribute.Strategy` `model` was created under, or None (no strategy scope)."""
    return model._distribute_strategy


def iterator_element_spec(iterator):
    """The element spec of the dataset a Keras TensorFlow `TFEpochIterator` iterates."""
    return iterator._distributed_dataset.element_spec


def inputs_struct(model):
    """A model's symbolic inputs: as given to a functional model (dict, list), else `inputs`."""
    return model._inputs_struct if isinstance(model, Functional) else model.inputs


def producing_layer(tensor):
    """The layer (operation) whose output the symbolic `keras.KerasTensor` `tensor` is."""
    return tensor._keras_history.operation


def register_functional_name(sub: type, cls: type) -> None:
    """Saves the functional variant `sub` of `cls` under `cls`'s registered name."""
    object_registration.GLOBAL_CUSTOM_NAMES[sub] = keras.saving.get_registered_name(cls)


def has_global_state() -> bool:
    """Whether this Keras exposes the layer-name counters where npu_rec expects them."""
    return global_state is not None and all(
        hasattr(global_state, f) for f in ("get_global_attribute", "set_global_attribute")
    )


def _optimizers_of(optimizer) -> list:
    """`optimizer` and the optimizers it wraps (a `LossScaleOptimizer`'s inner one)."""
    out = []
    while optimizer is not None and optimizer not in out:
        out.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return out


@contextlib.contextmanager
def gradients_already_reduced(optimizer):
    """While tracing a step: `optimizer.apply_gradients` applies the gradients as given.

    The TensorFlow optimizer all-reduces the gradients over the replicas inside
    `apply_gradients` (`_all_reduce_sum_gradients`); inside this context that
    reduction returns the pairs unchanged, on `optimizer` and on any optimizer
    it wraps. For gradients the step has already summed over the workers.
    """
    name = "_all_reduce_sum_gradients"
    replaced = [(o, vars(o).get(name)) for o in _optimizers_of(optimizer) if hasattr(o, name)]
    for o, _ in replaced:
        object.__setattr__(o, name, list)
    try:
        yield
    finally:
        for o, before in replaced:
            if before is None:
                object.__delattr__(o, name)
            else:
                object.__setattr__(o, name, before)
