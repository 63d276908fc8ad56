"""`RecModel.online_train`: MindSpore Rec's online training on an unbounded stream.

Semantics on this platform (CPU, TensorFlow):

* The run trains until a callback sets `model.stop_training`, the data ends,
  or the global step reaches `npu_rec.init(max_steps=...)` (when > 0). A
  resumed run (a `SparseCheckpoint` restoring at start) trains only the
  remaining `max_steps - restored_step` steps.
* `dataset_sink_mode=True` runs `sink_size` training steps per compiled call
  (Keras' `steps_per_execution`), so per-batch callbacks see one call per
  `sink_size` steps, as MindSpore's sink mode calls `step_end` per sink.
  MindSpore needs `sink_size=1` on its devices and cannot sink on CPU; here
  every `sink_size >= 1` works in one process (several workers: 1 only, as
  Keras cannot run several steps per call under `MultiWorkerMirroredStrategy`). With `max_steps`, the last call may run
  fewer steps so the run ends exactly at `max_steps`.
* `dataset_sink_mode=False` runs one step per call and ignores `sink_size`.
* Tables with eviction on and no `Evict` callback get a default
  `Evict()` (every 24 hours of training time), like Rec SDK's EvictHook.
"""

from __future__ import annotations

import keras

from npu_rec import _log as logging
from npu_rec._rec_config import get_config
from npu_rec.keras import _keras_fixes


def online_train(model, train_dataset, callbacks, dataset_sink_mode, sink_size):
    from npu_rec.keras.callbacks import Evict, SparseCheckpoint
    from npu_rec.keras.callbacks._common import online_training

    if not isinstance(dataset_sink_mode, bool):
        raise ValueError(
            "`dataset_sink_mode` must be True or False. "
            f"Received: dataset_sink_mode={dataset_sink_mode!r}"
        )
    if isinstance(sink_size, bool) or not isinstance(sink_size, int) or sink_size < 1:
        raise ValueError(f"`sink_size` must be an integer >= 1. Received: sink_size={sink_size!r}")
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            "online_train needs a compiled model: call model.compile(optimizer=..., "
            "loss=...) or pass optimizer= to RecModel. Received: optimizer=None"
        )
    if callbacks is None:
        callbacks = []
    elif isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    callbacks = list(callbacks)
    for cb in callbacks:
        if isinstance(cb, SparseCheckpoint):
            cb.prepare(model)
    if not any(isinstance(cb, Evict) for cb in callbacks) and any(
        t.config.eviction_threshold >= 0 for t in model.tables
    ):
        callbacks.append(Evict())
    max_steps = get_config().max_steps
    start = model.global_step
    remaining = None
    if max_steps > 0:
        remaining = max_steps - start
        if remaining <= 0:
            logging.info(
                "npu_rec: online_train: global step %d already reached max_steps=%d.",
                start,
                max_steps,
            )
            return keras.callbacks.History()
    per_call = sink_size if dataset_sink_mode else 1
    if per_call > 1 and _keras_fixes.multi_worker(model.distribute_strategy):
        raise ValueError(
            "online_train with dataset_sink_mode=True runs `sink_size` steps per compiled "
            "call (Keras steps_per_execution), which Keras cannot do under "
            "MultiWorkerMirroredStrategy: use sink_size=1 or dataset_sink_mode=False. "
            f"Received: dataset_sink_mode=True, sink_size={sink_size}"
        )
    saved = (model.steps_per_execution, model.train_function)
    model.steps_per_execution = per_call
    model.train_function = None
    try:
        with online_training(model):
            return model.fit(
                train_dataset,
                epochs=1,
                steps_per_epoch=remaining,
                callbacks=callbacks,
                verbose=0,
                shuffle=False,
            )
    finally:
        for cb in callbacks:
            if isinstance(cb, SparseCheckpoint):
                cb.release()
        model.steps_per_execution, model.train_function = saved[0], None
