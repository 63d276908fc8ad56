"""Helpers shared by the callbacks: the global step, the model's tables, online training."""

from __future__ import annotations

import contextlib
import threading

from npu_rec.keras._layers import model_tables

_ONLINE = threading.local()


def global_step(model) -> int:
    """Steps trained so far: `RecModel.global_step`, else the optimizer's iterations."""
    if hasattr(model, "global_step"):  # a RecModel
        return int(model.global_step)
    return int(model.optimizer.iterations.numpy())


def set_global_step(model, step: int) -> None:
    """Sets a `RecModel`'s global step (other Keras models count optimizer iterations)."""
    if hasattr(model, "global_step"):
        model.global_step = int(step)


@contextlib.contextmanager
def online_training(model):
    """Marks `model` as trained by `RecModel.online_train` (one pass) within the block."""
    running = _online_models()
    running.add(id(model))
    try:
        yield
    finally:
        running.discard(id(model))


def in_online_training(model) -> bool:
    """Whether `model` runs inside `online_training` (this thread)."""
    return id(model) in _online_models()


def _online_models() -> set:
    if not hasattr(_ONLINE, "models"):
        _ONLINE.models = set()
    return _ONLINE.models


def tables_of(model, tables=None) -> list:
    """`tables` if given, else the sparse tables of `model`'s `SparseEmbedding` layers."""
    return list(tables) if tables is not None else model_tables(model)
