"""The Keras bugs that `npu_rec/keras/_keras_fixes.py` works around are still there.

When a test here fails, the installed Keras changed the code the workaround is for:
check whether keras-team/keras#20585 is fixed in that version, and if so remove the
workaround (and this test). The workarounds themselves are exercised end to end by
tests/distribute/test_multi_worker_fit.py (two workers, `fit`).
"""

import inspect

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer

from npu_rec.keras import _keras_fixes


def _source(obj) -> str:
    return "".join(inspect.getsource(obj).split())


def test_keras_still_reduces_the_first_batch_across_replicas():
    # Bug 1: the nest of PerReplica values of a dict batch cannot be reduced.
    assert 'self.distribute_strategy.reduce("MEAN",maybe_distributed_data_batch' in _source(
        tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    ), (
        f"Keras {keras.__version__} changed _maybe_symbolic_build: is keras#20585 fixed? "
        "Then RecModel can call super()._maybe_symbolic_build under a multi-worker strategy."
    )


def test_keras_still_reduces_scalar_logs_along_axis_0():
    # Bug 2: scalar logs are reduced with axis=0, and fit always asks for "auto" (= mean).
    assert 'strategy.reduce("MEAN",v,axis=0)' in _source(tf_trainer.reduce_per_replica), (
        f"Keras {keras.__version__} changed reduce_per_replica: are scalar logs reduced "
        "correctly now? Then `logs_for_reduction` can go."
    )
    assert 'reduction="auto"' in _source(tf_trainer.TensorFlowTrainer._make_function)


def test_outside_a_multi_worker_strategy_the_fixes_change_nothing():
    logs = {"loss": tf.constant(0.5), "auc": tf.constant(0.7)}
    assert _keras_fixes.logs_for_reduction(logs) is logs
    assert not _keras_fixes.multi_worker(tf.distribute.get_strategy())
    assert float(_keras_fixes.unscale_loss(tf.constant(0.25))) == 0.25
