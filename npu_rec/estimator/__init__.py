"""The Estimator front end of npu_rec: tf.estimator / npu_bridge on `tf.compat.v1` graphs.

See docs/estimator.md. A `model_fn` written for `tf.estimator` ports by
changing its imports to `npu_rec.estimator`.
"""

import tensorflow as tf

from npu_rec.estimator import experimental, export
from npu_rec.estimator._auc import streaming_auc
from npu_rec.estimator._estimator import NPUEstimator
from npu_rec.estimator._exporter import BestExporter, Exporter, FinalExporter, LatestExporter
from npu_rec.estimator._extenders import (
    add_metrics,
    classifier_parse_example_spec,
    regressor_parse_example_spec,
)
from npu_rec.estimator._hooks import EvictHook, SparseCheckpointSaverHook, TellMeStepOrLossHook
from npu_rec.estimator._run_config import ExperimentalConfig, NPURunConfig, RunConfig
from npu_rec.estimator._sparse_train import sparse_train_op
from npu_rec.estimator._spec import EstimatorSpec, EvalSpec, ModeKeys, TrainSpec
from npu_rec.estimator._train_and_evaluate import train_and_evaluate
from npu_rec.estimator._warm_start import VocabInfo, WarmStartSettings
from npu_rec.estimator.export import ServingInputReceiver, build_raw_serving_input_receiver_fn

Estimator = NPUEstimator
# tf.estimator's session-run names are TensorFlow's, as they are in tf.estimator.
CheckpointSaverHook = tf.compat.v1.train.CheckpointSaverHook
CheckpointSaverListener = tf.compat.v1.train.CheckpointSaverListener
FeedFnHook = tf.compat.v1.train.FeedFnHook
FinalOpsHook = tf.compat.v1.train.FinalOpsHook
GlobalStepWaiterHook = tf.compat.v1.train.GlobalStepWaiterHook
LoggingTensorHook = tf.compat.v1.train.LoggingTensorHook
NanLossDuringTrainingError = tf.compat.v1.train.NanLossDuringTrainingError
NanTensorHook = tf.compat.v1.train.NanTensorHook
ProfilerHook = tf.compat.v1.train.ProfilerHook
SecondOrStepTimer = tf.compat.v1.train.SecondOrStepTimer
SessionRunArgs = tf.compat.v1.train.SessionRunArgs
SessionRunContext = tf.compat.v1.train.SessionRunContext
SessionRunHook = tf.compat.v1.train.SessionRunHook
SessionRunValues = tf.compat.v1.train.SessionRunValues
StepCounterHook = tf.compat.v1.train.StepCounterHook
StopAtStepHook = tf.compat.v1.train.StopAtStepHook
SummarySaverHook = tf.compat.v1.train.SummarySaverHook

__all__ = [
    "BestExporter",
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "EvictHook",
    "ExperimentalConfig",
    "Exporter",
    "FeedFnHook",
    "FinalExporter",
    "FinalOpsHook",
    "GlobalStepWaiterHook",
    "LatestExporter",
    "LoggingTensorHook",
    "ModeKeys",
    "NPUEstimator",
    "NPURunConfig",
    "NanLossDuringTrainingError",
    "NanTensorHook",
    "ProfilerHook",
    "RunConfig",
    "SecondOrStepTimer",
    "ServingInputReceiver",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "SparseCheckpointSaverHook",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
    "TellMeStepOrLossHook",
    "TrainSpec",
    "VocabInfo",
    "WarmStartSettings",
    "add_metrics",
    "build_raw_serving_input_receiver_fn",
    "classifier_parse_example_spec",
    "experimental",
    "export",
    "regressor_parse_example_spec",
    "sparse_train_op",
    "streaming_auc",
    "train_and_evaluate",
]
