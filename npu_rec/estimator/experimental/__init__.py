"""`npu_rec.estimator.experimental`: tf.estimator.experimental's training-driver hooks.

Early stopping by evaluation results (`stop_if_higher_hook`, `stop_if_lower_hook`,
`stop_if_no_increase_hook`, `stop_if_no_decrease_hook`, `make_early_stopping_hook`),
`make_stop_at_checkpoint_step_hook`, `InMemoryEvaluatorHook` and `call_logit_fn`; see
docs/estimator.md, "Driver hooks".
"""

from npu_rec.estimator._early_stopping import (
    make_early_stopping_hook,
    make_stop_at_checkpoint_step_hook,
    stop_if_higher_hook,
    stop_if_lower_hook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)
from npu_rec.estimator._extenders import call_logit_fn
from npu_rec.estimator._in_memory_evaluator import InMemoryEvaluatorHook

__all__ = [
    "InMemoryEvaluatorHook",
    "call_logit_fn",
    "make_early_stopping_hook",
    "make_stop_at_checkpoint_step_hook",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]
