"""The Estimator front end of npu_rec: tf.estimator / npu_bridge on `tf.compat.v1` graphs.

See docs/estimator.md. A `model_fn` written for `tf.estimator` ports by
changing its imports to `npu_rec.estimator`.
"""

import tensorflow as tf

from npu_rec.estimator import experimental, export
from npu_rec.estimator._auc import streaming_auc
from npu_rec.estimator._estimator import NPUEstimator
from npu_rec.estimator._exporter import BestExporter, Exporter, FinalExporter, LatestExporter
from npu_rec.estimator._hooks import EvictHook, SparseCheckpointSaverHook, TellMeStepOrLossHook
from npu_rec.estimator._run_config import ExperimentalConfig, NPURunConfig, RunConfig
from npu_rec.estimator._sparse_train import sparse_train_op
from npu_rec.estimator._spec import EstimatorSpec, EvalSpec, ModeKeys, TrainSpec
from npu_rec.estimator._train_and_evaluate import train_and_evaluate
from npu_rec.estimator._warm_start import VocabInfo, WarmStartSettings
from npu_rec.estimator.export import ServingInputReceiver, build_raw_serving_input_receiver_fn

Estimator = NPUEstimator
CheckpointSaverListener = tf.compat.v1.train.CheckpointSaverListener

__all__ = [
    "BestExporter",
    "CheckpointSaverListener",
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "EvictHook",
    "ExperimentalConfig",
    "Exporter",
    "FinalExporter",
    "LatestExporter",
    "ModeKeys",
    "NPUEstimator",
    "NPURunConfig",
    "RunConfig",
    "ServingInputReceiver",
    "SparseCheckpointSaverHook",
    "TellMeStepOrLossHook",
    "TrainSpec",
    "VocabInfo",
    "WarmStartSettings",
    "build_raw_serving_input_receiver_fn",
    "experimental",
    "export",
    "sparse_train_op",
    "streaming_auc",
    "train_and_evaluate",
]
