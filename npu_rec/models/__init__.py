"""Reference recommendation models built on npu_rec's public API."""

from npu_rec.models._deepfm import build_deepfm, hashed_embedding_fn
from npu_rec.models._dlrm import build_dlrm, build_wide_deep

__all__ = ["build_deepfm", "build_dlrm", "build_wide_deep", "hashed_embedding_fn"]
