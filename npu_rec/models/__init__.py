"""Reference recommendation models built on npu_rec's public API.

DeepFM, Wide & Deep and DLRM, each described once (`deepfm_logit`,
`wide_deep_logit`, `dlrm_logit`) and available as

* a Keras model: `build_rec_model(model, feature_specs, dense_names)` (a
  `npu_rec.keras.RecModel` over sparse tables), or `build_deepfm` /
  `build_wide_deep` / `build_dlrm` with any `embedding_fn`;
* an Estimator `model_fn`: `estimator_model_fn(model, feature_specs, dense_names)`.

Both forms create the same tables (see `FeatureTables`) from a list of
`npu_rec.data.FeatureSpec`s.
"""

from npu_rec.models._features import (
    FeatureTables,
    default_sparse_optimizer,
    grouped_embed,
    specs_for,
)
from npu_rec.models._keras import (
    build_deepfm,
    build_dlrm,
    build_rec_model,
    build_wide_deep,
    hashed_embedding_fn,
    sparse_embedding_fn,
)
from npu_rec.models._model_fn import TRAIN_OUTPUTS, estimator_model_fn
from npu_rec.models._networks import (
    MODELS,
    deepfm_logit,
    dense_block,
    dlrm_logit,
    logit_fn,
    wide_deep_logit,
)

__all__ = [
    "MODELS",
    "TRAIN_OUTPUTS",
    "FeatureTables",
    "build_deepfm",
    "build_dlrm",
    "build_rec_model",
    "build_wide_deep",
    "deepfm_logit",
    "default_sparse_optimizer",
    "dense_block",
    "dlrm_logit",
    "estimator_model_fn",
    "grouped_embed",
    "hashed_embedding_fn",
    "logit_fn",
    "sparse_embedding_fn",
    "specs_for",
    "wide_deep_logit",
]
