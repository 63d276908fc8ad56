"""Helpers shared by the callbacks: the global step and the model's tables."""

from __future__ import annotations

from npu_rec.keras._layers import model_tables


def global_step(model) -> int:
    """Steps trained so far: `RecModel.global_step`, else the optimizer's iterations."""
    step = getattr(model, "_global_step", None)
    if step is None:
        step = model.optimizer.iterations
    return int(step.numpy())


def tables_of(model, tables=None) -> list:
    """`tables` if given, else the sparse tables of `model`'s `SparseEmbedding` layers."""
    return list(tables) if tables is not None else model_tables(model)
