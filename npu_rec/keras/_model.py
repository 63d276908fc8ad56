"""`RecModel`: a `keras.Model` whose train step also trains its sparse tables."""

from __future__ import annotations

import contextlib
import functools

import keras
import tensorflow as tf

from npu_rec import _keras_private, distribute
from npu_rec import _log as logging
from npu_rec._keras_private import Functional, Trainer, functional_init_arguments
from npu_rec.distribute import _step_exchange, _tf_private
from npu_rec.keras import _amp, _finite, _follow, _keras_fixes, _online, _serving
from npu_rec.keras._layers import model_tables, sparse_embeddings
from npu_rec.keras._model_state import ModelStateMixin
from npu_rec.table import _lookup

_REC_ARGS = (
    "network",
    "loss_fn",
    "optimizer",
    "metrics",
    "eval_network",
    "eval_indexes",
    "amp_level",
    "boost_level",
)


def _waits_for_the_batch(step):
    """Every op of `step` runs after its batch has been read.

    Keras ends an epoch over a dataset of unknown length when `get_next` fails
    inside the step function. Ops of the step that do not depend on the batch
    (a metric's sample count from a static batch size) could run all the same
    and count a batch that never came: the epoch's loss and metrics were too
    low by 1/(batches + 1). Control dependencies on the batch's tensors stop
    them. Eagerly the batch is there before the step starts, and this is a no-op.
    """

    @functools.wraps(step)
    def wrapped(self, data):
        tensors = [
            t for t in tf.nest.flatten(data, expand_composites=True) if isinstance(t, tf.Tensor)
        ]
        with tf.control_dependencies(tensors):
            return step(self, data)

    return wrapped


@keras.saving.register_keras_serializable(package="npu_rec")
class RecModel(ModelStateMixin, keras.Model):
    """A Keras model whose `fit` trains dense weights and sparse tables together.

    Three ways to build one:

    * functional: `RecModel(inputs, outputs)`, then `compile` and `fit`;
    * subclassed: `class MyModel(RecModel)` with `SparseEmbedding` layers in `call`;
    * MindSpore Rec's wrapper: `RecModel(network=net, loss_fn=..., optimizer=...,
      metrics=..., eval_network=..., eval_indexes=..., amp_level=..., boost_level=...)`;
      with `optimizer` given it is compiled at once.

    Each training step records the lookups of its `SparseEmbedding` layers,
    differentiates the loss with respect to the dense weights and to the rows
    looked up, applies the compiled Keras optimizer to the dense weights and
    each table's own sparse optimizer to the rows of this batch, in one
    compiled step. `jit_compile` defaults to False (hash tables have no XLA
    kernels). A NaN or infinite loss stops training with
    `NanLossDuringTrainingError` before that step updates anything.
    `get_weights` / `set_weights` carry a snapshot of the tables (so
    `EarlyStopping(restore_best_weights=True)` restores them too), and the
    global step is saved in `.keras` / `.weights.h5` files.

    Args (wrapper form):
      network: The Keras layer/model to train (inputs -> predictions, or the
        loss itself when `loss_fn` is None).
      loss_fn: A Keras loss; None means `network(data)` returns the loss.
      optimizer: A Keras optimizer for the dense weights (None: call `compile`).
      metrics: Metrics as a list, set or dict of names/objects, e.g. {"auc"}.
      eval_network: Network used by `evaluate` instead of `network` + `loss_fn`;
        called as `eval_network(x, y)`.
      eval_indexes: With `eval_network`: positions of (loss, prediction, label)
        in its outputs. None: its outputs are (prediction, label).
      amp_level: "O0", "O2", "O3" or "auto" (see docs/keras.md); any form.
      boost_level: "O0", "O1", "O2"; accepted for MindSpore compatibility,
        no effect on CPU (logged); any form.

    Example:
      >>> ids = keras.Input(shape=(), dtype="int64")
      >>> emb = SparseEmbedding("item", 8, optimizer=npu_rec.optimizers.Adagrad(0.05))(ids)
      >>> model = RecModel(ids, keras.layers.Dense(1, activation="sigmoid")(emb))
      >>> model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc"])
    """

    def __new__(cls, *args, **kwargs):
        if functional_init_arguments(args, kwargs) and not issubclass(cls, Functional):
            cls = _functional_class(cls)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        rec = {k: kwargs.pop(k) for k in _REC_ARGS if k in kwargs}
        if args and isinstance(args[0], keras.layers.Layer):
            rec.update(zip(_REC_ARGS, args, strict=False))
            args = ()
        self._wrapper = rec.get("network") is not None
        if not self._wrapper:
            extra = sorted(k for k in rec if k not in ("amp_level", "boost_level"))
            if extra:
                raise ValueError(
                    f"{extra} are arguments of the wrapper form and need "
                    f"`network`. Received: network=None, {extra}"
                )
        if functional_init_arguments(args, kwargs):
            Trainer.__init__(self)
            Functional.__init__(self, *args, **kwargs)
        else:
            keras.Model.__init__(self, *args, **kwargs)
        self.amp_level = _amp.check_level("amp_level", rec.get("amp_level", "O0"), _amp.AMP_LEVELS)
        self.boost_level = _amp.check_level(
            "boost_level", rec.get("boost_level", "O0"), _amp.BOOST_LEVELS
        )
        if self.boost_level != "O0":
            logging.info(
                "npu_rec: boost_level=%s has no effect on this platform.", self.boost_level
            )
        self._global_step = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="npu_rec_global_step"
        )
        #: Times the tables' state was replaced from outside training (`set_weights`
        #: with a snapshot, `load_weights`): a delta checkpoint cannot build on a
        #: save made before, so `SparseCheckpoint` saves full after one.
        self.table_state_loads = 0
        self.network = rec.get("network")
        self.eval_network = rec.get("eval_network")
        self.eval_indexes = rec.get("eval_indexes")
        self.loss_fn = rec.get("loss_fn")
        if self.eval_indexes is not None:
            if self.eval_network is None or len(self.eval_indexes) != 3:
                raise ValueError(
                    "`eval_indexes` needs `eval_network` and must list 3 positions "
                    "(loss, prediction, label). Received: "
                    f"eval_indexes={self.eval_indexes!r}"
                )
        self._loss_in_network = self._wrapper and self.loss_fn is None
        self._resolved_amp = _amp.apply_amp_level(self.network or self, self.amp_level)
        if self._wrapper and rec.get("optimizer") is not None:
            metrics = rec.get("metrics")
            if isinstance(metrics, (set, frozenset)):
                metrics = sorted(metrics)
            elif isinstance(metrics, dict):
                metrics = list(metrics.values())
            self.compile(optimizer=rec["optimizer"], loss=self.loss_fn, metrics=metrics)

    # ------------------------------------------------------------------ basics
    @property
    def global_step(self) -> int:
        """Training steps run so far (restored by `SparseCheckpoint`, which sets it)."""
        return int(self._global_step.numpy())

    @global_step.setter
    def global_step(self, step: int) -> None:
        self._global_step.assign(int(step))

    @property
    def tables(self) -> list:
        """The distinct `SparseTable`s of this model's `SparseEmbedding` layers."""
        return model_tables(self)

    def build(self, input_shape=None):
        if not self._wrapper:
            return super().build(input_shape)
        if not self.network.built and input_shape is not None:
            self.network.build(input_shape)
        self.built = True

    def call(self, inputs, training=None):
        if not self._wrapper:
            return super().call(inputs, training=training)
        return self.network(inputs, training=training)

    def compile(self, optimizer="rmsprop", loss=None, *args, jit_compile=False, **kwargs):
        """`keras.Model.compile`, with `jit_compile=False` by default.

        With amp_level "O2" the optimizer is wrapped in a dynamic
        `keras.optimizers.LossScaleOptimizer`.

        Raises:
          ValueError: `jit_compile=True`: the sparse tables' hash-map kernels
            cannot be compiled with XLA.
        """
        if jit_compile not in (False, "auto"):
            raise ValueError(
                "RecModel cannot use XLA: sparse table lookups are hash-map ops "
                f"without XLA kernels. Use jit_compile=False. Received: "
                f"jit_compile={jit_compile!r}"
            )
        super().compile(optimizer, loss, *args, jit_compile=False, **kwargs)
        if self._resolved_amp == "O2":
            self.optimizer = _amp.wrap_loss_scale(self.optimizer)
        self._follow_compiled_optimizer()

    def _follow_compiled_optimizer(self):
        """Tables without a sparse optimizer of their own follow the compiled one (`_follow`).

        A table not created yet (a subclassed model's layer) is bound at the
        first trace of the train step; its error, if any, is raised here.
        """
        for layer in sparse_embeddings(self):
            if not layer.trainable:
                continue
            owner = f"SparseEmbedding {layer.name!r}"
            if layer.table_created:
                _follow.bind(owner, layer.table, self.optimizer)
            elif layer.given_optimizer is None:
                _follow.check(owner, layer.table_name, self.optimizer)

    def _trained_records(self, records):
        """The lookups to update: frozen tables' dropped, the others' optimizers bound.

        A table is frozen when every `SparseEmbedding` that looks it up has
        `trainable=False`. Any other table without an optimizer of its own
        follows the compiled optimizer.
        """
        layers = [layer for layer in sparse_embeddings(self) if layer.table_created]
        trained = {id(layer.table) for layer in layers if layer.trainable}
        owners = {id(layer.table): f"SparseEmbedding {layer.name!r}" for layer in layers}
        kept = []
        for r in records:
            if id(r.table) in owners and id(r.table) not in trained:
                continue
            if r.table.optimizer is None:
                owner = owners.get(id(r.table), f"A lookup in model {self.name!r}")
                _follow.bind(owner, r.table, self.optimizer)
            kept.append(r)
        return kept

    def compile_from_config(self, config):
        """Re-compiles a loaded model from its saved compile config."""
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built and self.optimizer is not None:
            self.optimizer.build(self.trainable_variables)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Builds optimizer, loss and metric state before the step is traced.

        Keras (TensorFlow backend, no distribution strategy) leaves this to the
        first trace of the train step, which then creates variables and is
        traced a second time. A RecModel step, with its sparse lookups, is
        costly to trace, so the state is built here from the data's element
        spec (no batch is read) and the step is traced once.
        """
        strategy = _keras_private.strategy_of(self)
        if _keras_fixes.multi_worker(strategy):
            spec = _element_spec(iterator) if data_batch is None else data_batch
            return _keras_fixes.symbolic_build(self, strategy, spec)
        if strategy is not None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        if data_batch is None:
            data_batch = _element_spec(iterator)
            if data_batch is None:
                return None
        try:
            _keras_private.symbolic_build(self, data_batch)
        except Exception as err:  # Keras builds at the first trace instead
            logging.debug("npu_rec: symbolic build skipped (%s); building at the first trace.", err)
        return None

    # -------------------------------------------------------------- the steps
    def _forward_loss(self, data, training: bool):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if self._loss_in_network:
            loss = tf.reduce_mean(tf.cast(self.network(data, training=training), tf.float32))
            return x, y, None, sample_weight, loss
        y_pred = self(x, training=training)
        y_pred = tf.nest.map_structure(
            lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, y_pred
        )
        loss = self.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        return x, y, y_pred, sample_weight, loss

    def _gathered_lookups(self, data, training: bool, predicting: bool = False):
        """Under a multi-worker strategy: the step's table lookups exchanged in one go.

        The ids of every worker-sharded table come from a first pass of the
        model on the batch (`training=False`, outputs unused; see
        `npu_rec.distribute._step_exchange`): the step then makes 4 sparse
        collectives (a size exchange and 3 all-to-alls; 3 when it does not
        train) whatever the number of tables.
        """
        if not _keras_fixes.multi_worker(tf.distribute.get_strategy()):
            return contextlib.nullcontext()

        def forward():
            x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
            if predicting:
                self(x, training=False)
            elif self._loss_in_network:
                self.network(data, training=False)
            elif not training and self.eval_network is not None:
                self.eval_network(x, y, training=False)
            else:
                self(x, training=False)

        return _step_exchange.prefetched_lookups(forward, training)

    @_waits_for_the_batch
    def train_step(self, data):
        with (
            self._gathered_lookups(data, training=True),
            tf.GradientTape() as tape,
            _lookup.record_lookups(tape) as records,
        ):
            x, y, y_pred, sample_weight, loss = self._forward_loss(data, training=True)
            # Keras divides a compiled loss by the replicas (their gradients are summed).
            _keras_private.loss_tracker(self).update_state(
                _keras_fixes.unscale_loss(loss), sample_weight=_batch_size(x)
            )
            scaled = self.optimizer.scale_loss(loss)
        records = self._trained_records(records)
        dense_vars = list(self.trainable_variables)
        grads = tape.gradient(scaled, dense_vars + [r.embeddings for r in records])
        dense_grads, sparse_grads = grads[: len(dense_vars)], grads[len(dense_vars) :]
        apply_sparse = True
        # The table gradients stay per-id `IndexedSlices`: `apply_recorded_gradients`
        # sums them (inside the update kernel on the kernel path). Loss scaling sums
        # them here, to unscale and check the sums.
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            sparse_grads = [
                None if g is None else _lookup.densify(g, tf.shape(r.rows)[0])
                for g, r in zip(sparse_grads, records, strict=True)
            ]
            if not self.optimizer.built:
                self.optimizer.build(dense_vars)
            scale = tf.convert_to_tensor(self.optimizer.dynamic_scale)
            sparse_grads = [None if g is None else g / scale for g in sparse_grads]
            apply_sparse = _on_every_worker(
                self.optimizer.check_finite(
                    [g for g in dense_grads + sparse_grads if g is not None]
                )
            )
            if dense_grads:  # a non-finite table gradient also skips the dense step
                poison = tf.where(apply_sparse, 0.0, float("nan"))
                dense_grads = [
                    None if g is None else g + tf.cast(poison, g.dtype) for g in dense_grads
                ]
        # Every update waits for the check of this batch's loss: a non-finite loss stops
        # the run before it changes a weight, a table row or a step counter (and no
        # counter moves when the iterator turns out to have no batch left).
        with tf.control_dependencies([_finite.check_loss(loss)]):
            if _keras_fixes.multi_worker(tf.distribute.get_strategy()):
                # One all-reduce for the dense gradients and the logs (`train_function`
                # returns the logs as reduced here); the optimizer skips its own.
                logs = self._train_logs(x, y, y_pred, sample_weight)
                dense_grads, logs = _keras_fixes.all_reduce_with_logs(dense_grads, logs)
                with _keras_private.gradients_already_reduced(self.optimizer):
                    self._apply_updates(
                        records, dense_vars, dense_grads, sparse_grads, apply_sparse
                    )
                return logs
            self._apply_updates(records, dense_vars, dense_grads, sparse_grads, apply_sparse)
        return _keras_fixes.logs_for_reduction(self._train_logs(x, y, y_pred, sample_weight))

    def _train_logs(self, x, y, y_pred, sample_weight):
        if self._loss_in_network:
            return self._metric_results()
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _apply_updates(self, records, dense_vars, dense_grads, sparse_grads, apply_sparse):
        if dense_vars:
            self.optimizer.apply_gradients(zip(dense_grads, dense_vars, strict=False))
        if records:
            if apply_sparse is True:
                _lookup.apply_recorded_gradients(records, sparse_grads)
            elif _keras_fixes.multi_worker(tf.distribute.get_strategy()):
                with distribute.updates_only_when(apply_sparse):
                    _lookup.apply_recorded_gradients(records, sparse_grads)
            else:
                tf.cond(
                    apply_sparse,
                    lambda: _sparse_update(records, sparse_grads),
                    lambda: tf.constant(False),
                )
        self._global_step.assign_add(1)

    def make_train_function(self, force=False):
        """Keras' train function; a non-finite loss raises `NanLossDuringTrainingError`.

        Under a multi-worker strategy the function is `RecModel`'s own (see
        `_keras_fixes.train_function`): the step's logs are averaged over the
        workers in the dense gradients' all-reduce, not by Keras after the step.
        """
        if self.train_function is not None and not force:
            return self.train_function
        if _keras_fixes.multi_worker(self.distribute_strategy):
            # The step reduces its logs with its gradients (`train_step`): Keras'
            # function would reduce each log again, with 2 all-reduces.
            self.train_function = _keras_fixes.train_function(self)
        else:
            super().make_train_function(force=force)
        self.train_function = _finite.stop_on_nan(self, self.train_function)
        return self.train_function

    @_waits_for_the_batch
    def test_step(self, data):
        with self._gathered_lookups(data, training=False):
            logs = self._test_logs(data)
        if _keras_fixes.multi_worker(tf.distribute.get_strategy()):
            # One all-reduce for every log (`make_test_function` returns them as reduced).
            return _keras_fixes.reduced_logs(logs)
        return _keras_fixes.logs_for_reduction(logs)

    def make_test_function(self, force=False):
        """Keras' test function; under a multi-worker strategy `RecModel`'s own.

        There the evaluation step averages its logs over the workers in one
        all-reduce (`test_step`), where Keras' function reduces each log with
        2 all-reduces after the step.
        """
        if self.test_function is not None and not force:
            return self.test_function
        if _keras_fixes.multi_worker(self.distribute_strategy):
            self.test_function = _keras_fixes.test_function(self)
            return self.test_function
        return super().make_test_function(force=force)

    def predict_step(self, data):
        with self._gathered_lookups(data, training=False, predicting=True):
            return super().predict_step(data)

    def _test_logs(self, data):
        if self.eval_network is None and not self._loss_in_network:
            return super().test_step(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if self.eval_network is None:
            _, _, _, _, loss = self._forward_loss(data, training=False)
            _keras_private.loss_tracker(self).update_state(loss, sample_weight=_batch_size(x))
            return self._metric_results()
        outputs = self.eval_network(x, y, training=False)
        if self.eval_indexes is None:
            y_pred, y_true = outputs
        else:
            i_loss, i_pred, i_label = self.eval_indexes
            _keras_private.loss_tracker(self).update_state(
                outputs[i_loss], sample_weight=_batch_size(x)
            )
            y_pred, y_true = outputs[i_pred], outputs[i_label]
        return self.compute_metrics(x, y_true, y_pred, sample_weight=sample_weight)

    def _metric_results(self):
        return {"loss": _keras_private.loss_tracker(self).result()}

    def export(
        self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs
    ):
        """Keras' serving export: a SavedModel of stock TensorFlow ops (`export_for_serving`).

        Raises:
          ValueError: a format other than "tf_saved_model" (the sparse tables only
            export as frozen TensorFlow lookups), an unknown option, or an
            `input_signature` that is not a one-entry list (Keras' form).
        """
        _serving.keras_export(self, filepath, format, verbose, input_signature, **kwargs)

    # ---------------------------------------------------------------- training
    def fit(self, *args, callbacks=None, **kwargs):
        """`keras.Model.fit`; also checks `npu_rec.init`'s step settings (`StepConsistency`).

        A non-finite loss raises `NanLossDuringTrainingError`, or, with
        `keras.callbacks.TerminateOnNaN` among `callbacks`, stops training as
        Keras does (`stop_training`, `on_train_end` runs); either way the
        failing step updates no weight, table row or step counter.

        Under a multi-worker strategy (one replica per worker) an infinite
        `tf.data.Dataset` is split between the workers as Keras' `fit` splits
        it, each worker reading its part through a plain `tf.data` iterator
        (docs/distributed.md, "The worker's input iterator").

        Raises:
          ValueError: `steps_per_execution > 1` under a multi-worker strategy.
          npu_rec.distribute.WorkerLostError: a worker was lost (names it).
        """
        from npu_rec.keras.callbacks import StepConsistency
        from npu_rec.keras.callbacks._common import in_online_training

        callbacks = list(callbacks or [])
        if _keras_fixes.multi_worker(self.distribute_strategy) and self.steps_per_execution > 1:
            raise ValueError(
                "`steps_per_execution` must be 1 under MultiWorkerMirroredStrategy: Keras "
                "cannot run several steps per compiled call across workers (docs/distributed.md"
                f"). Compile with steps_per_execution=1. Received: steps_per_execution="
                f"{self.steps_per_execution}"
            )
        if not in_online_training(self) and not any(
            isinstance(c, StepConsistency) for c in callbacks
        ):
            callbacks.append(StepConsistency())
        # Keras' graceful stop (see `_finite`): without TerminateOnNaN a NaN loss raises.
        self.nan_stops_gracefully = any(
            isinstance(c, keras.callbacks.TerminateOnNaN) for c in callbacks
        )
        args, kwargs = _distributed_input(self, args, kwargs)
        try:
            return super().fit(*args, callbacks=callbacks, **kwargs)
        except distribute.PEER_ERRORS as err:
            if _keras_fixes.multi_worker(self.distribute_strategy):
                raise distribute.explain_peer_error(err) from err
            raise
        finally:  # Keras skips on_train_end when training raises: free checkpoint locks
            self.nan_stops_gracefully = False
            for c in callbacks:
                if callable(getattr(c, "release", None)):
                    c.release()

    def online_train(
        self, train_dataset, callbacks=None, dataset_sink_mode: bool = True, sink_size: int = 1
    ):
        """Trains on an unbounded dataset until a callback or `init(max_steps)` stops it.

        Args:
          train_dataset: A `tf.data.Dataset` (may repeat forever), a generator
            or a `keras.utils.PyDataset` yielding `(x, y)` batches (or whole
            data tuples when `loss_fn` is None).
          callbacks: Keras callbacks (e.g. `SparseCheckpoint`, `Evict`).
          dataset_sink_mode: True: run `sink_size` steps per compiled call
            (Keras `steps_per_execution`) and call per-batch callbacks once per
            call; False: one step per call, callbacks after every step.
          sink_size: Steps per compiled call in sink mode (>= 1; MindSpore
            needs 1 on its devices, any value works here). Ignored when
            `dataset_sink_mode=False`.

        Returns:
          The `keras.callbacks.History` of the run.

        Raises:
          ValueError: `sink_size` or `dataset_sink_mode` is invalid, the
            model is not compiled, or `sink_size > 1` in sink mode under a
            multi-worker strategy.
        """
        return _online.online_train(self, train_dataset, callbacks, dataset_sink_mode, sink_size)

    # ------------------------------------------------------------------ config
    def get_config(self):
        rec = {"amp_level": self.amp_level, "boost_level": self.boost_level}
        if not self._wrapper:
            return {**super().get_config(), **rec}
        ser = keras.saving.serialize_keras_object
        return {
            "name": self.name,
            "network": ser(self.network),
            "eval_network": None if self.eval_network is None else ser(self.eval_network),
            "eval_indexes": self.eval_indexes,
            **rec,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        rec = {k: config.pop(k) for k in ("amp_level", "boost_level") if k in config}
        if "network" in config:
            de = keras.saving.deserialize_keras_object
            network = de(config["network"], custom_objects=custom_objects)
            eval_network = (
                None
                if config.get("eval_network") is None
                else de(config["eval_network"], custom_objects=custom_objects)
            )
            return cls(
                network=network,
                eval_network=eval_network,
                eval_indexes=config.get("eval_indexes"),
                name=config.get("name"),
                **rec,
            )
        model = super().from_config(config, custom_objects=custom_objects)
        if rec.get("amp_level", "O0") != "O0" or rec.get("boost_level", "O0") != "O0":
            model.amp_level = rec.get("amp_level", "O0")
            model.boost_level = rec.get("boost_level", "O0")
            model._resolved_amp = _amp.apply_amp_level(model, model.amp_level)
        return model


_FUNCTIONAL_CLASSES: dict[type, type] = {}


def _functional_class(cls: type) -> type:
    """A `Functional` subclass of `cls`, so `cls` itself stays a subclassed model.

    Keras would otherwise rewrite the bases of `cls` to include `Functional` the
    first time it is built from inputs and outputs, breaking later wrapper or
    subclassed instances. The subclass saves under the registered name of `cls`.
    """
    if cls not in _FUNCTIONAL_CLASSES:
        sub = type(
            cls.__name__, (cls, Functional), {"__module__": cls.__module__, "__doc__": cls.__doc__}
        )
        _keras_private.register_functional_name(sub, cls)
        _FUNCTIONAL_CLASSES[cls] = sub
    return _FUNCTIONAL_CLASSES[cls]


def _on_every_worker(flag):
    """True when `flag` is True on every worker (one all-reduce under a multi-worker strategy).

    A loss-scaled step is skipped when a gradient is not finite; the workers must
    skip together: the dense update all-reduces, the table update exchanges rows.
    """
    if not _keras_fixes.multi_worker(tf.distribute.get_strategy()):
        return flag
    ctx = tf.distribute.get_replica_context()
    not_finite = ctx.all_reduce("SUM", tf.where(flag, 0.0, 1.0))
    return tf.equal(not_finite, 0.0)


def _sparse_update(records, grads):
    with tf.control_dependencies([_lookup.apply_recorded_gradients(records, grads)]):
        return tf.constant(True)


def _distributed_input(model, args, kwargs):
    """`fit`'s arguments with a `tf.data.Dataset` read by a plain iterator on each worker.

    Under a multi-worker strategy with one replica per worker, each worker
    reads its own part of the dataset exactly as the strategy splits it
    (`experimental_distribute_dataset`: the same samples in the same order),
    through a plain `tf.data` iterator in place of the strategy's multi-device
    iterator, whose prefetch thread reaches the worker's device through
    remote calls every step (docs/distributed.md). Only for a dataset known to
    be infinite (`repeat()`): the strategy's iterator makes the workers agree
    on the end of a finite one. Anything else (a finite dataset, several
    replicas per worker, `class_weight`, a dataset already distributed,
    arrays, generators) is left to Keras.
    """
    strategy = model.distribute_strategy
    if not _keras_fixes.multi_worker(strategy) or len(strategy.extended.worker_devices) != 1:
        return args, kwargs
    if args:
        x, rest, key = args[0], args[1:], None
    elif "x" in kwargs:
        x, rest, key = kwargs["x"], (), "x"
    else:
        return args, kwargs
    if not isinstance(x, tf.data.Dataset) or kwargs.get("class_weight") is not None:
        return args, kwargs
    x = _tf_private.worker_dataset(strategy.experimental_distribute_dataset(x))
    if x is None:  # a dataset that may end: the strategy's iterator handles its last batches
        return args, kwargs
    if key is None:
        return (x, *rest), kwargs
    return args, {**kwargs, "x": x}


def _element_spec(iterator):
    """The `tf.TensorSpec` structure of an epoch iterator's batches, or None."""
    if iterator is None:
        return None
    spec = tf.nest.map_structure(_replica_spec, _keras_private.iterator_element_spec(iterator))
    if not all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)):
        return None  # ragged/sparse inputs: let Keras build at the first trace
    return spec


def _replica_spec(spec):
    """One replica's `tf.TensorSpec` of a distributed dataset's per-replica spec, else `spec`.

    A multi-worker strategy's dataset describes each tensor of a batch by the
    spec of its per-replica value (one entry per local replica, all alike).
    Without this the build from the spec was skipped there, and the compiled
    metrics were built inside the first traced step, where a multi-worker
    step cannot initialize variables.
    """
    if not (
        isinstance(spec, tf.TypeSpec)
        and issubclass(spec.value_type, tf.distribute.DistributedValues)
    ):
        return spec
    replicas = tf.nest.flatten(spec, expand_composites=True)
    if replicas and all(isinstance(s, tf.TensorSpec) for s in replicas):
        return replicas[0]
    return spec


def _batch_size(x):
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    if isinstance(first, tf.SparseTensor):
        return first.dense_shape[0]
    if isinstance(first, tf.RaggedTensor):
        return first.nrows()
    return tf.shape(first)[0]
