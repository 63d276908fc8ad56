"""Reference recommendation models built on npu_rec's public API."""

from npu_rec.models._deepfm import build_deepfm, hashed_embedding_fn

__all__ = ["build_deepfm", "hashed_embedding_fn"]
