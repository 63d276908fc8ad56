"""TensorFlow internals that multi-worker training needs, fenced in one place.

`tests/distribute/test_tf_private.py` checks each of them against the
installed TensorFlow and names the version when one breaks.

* Plain variables inside a strategy scope: a worker's table shard must be
  ordinary resource variables (not `MirroredVariable`s, whose updates the
  strategy would synchronise across workers holding different keys), yet
  tables are created inside `strategy.scope()` (by `SparseEmbedding.build`).
  A variable creator that does not call the next creator in the stack
  skips the strategy's creator; the default creator it calls instead is
  `resource_variable_ops.default_variable_creator_v2` (TF 2.x).
* The strategy's communication options (for their timeout), and the worker
  count, kept privately by `CollectiveAllReduceExtended`.
* A distributed dataset's per-worker dataset (`DistributedDataset.
  _cloned_datasets`: the input after the strategy's rebatching and
  sharding), whether its iterator handles partial batches
  (`_enable_get_next_as_optional`), and Keras' test for a distributed dataset, which accepts
  subclasses of TensorFlow's own `DistributedDataset` class only.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from tensorflow.python.distribute import input_lib
from tensorflow.python.ops import resource_variable_ops


def _plain_creator(next_creator, **kwargs):
    del next_creator  # skip the strategy's creator (and any other) on purpose
    return resource_variable_ops.default_variable_creator_v2(None, **kwargs)


@contextlib.contextmanager
def outside_strategy():
    """Variables created in this block are plain `ResourceVariable`s, even in a strategy scope."""
    with tf.variable_creator_scope(_plain_creator):
        yield


def strategy_timeout(strategy) -> float | None:
    """The collective timeout set on `strategy`'s communication options, or None."""
    options = getattr(strategy.extended, "_communication_options", None)
    return getattr(options, "timeout_seconds", None)


class _WorkerDataset(input_lib.DistributedDataset):
    """One worker's part of a distributed dataset, iterated by a plain `tf.data` iterator.

    Keras' `fit` takes it as an already distributed dataset; with one replica
    per worker, `strategy.run` hands the worker's batch to its one replica.
    """

    def __init__(self, distributed):  # no super().__init__: nothing of it is used
        (self._worker_dataset,) = distributed._cloned_datasets
        self._worker_cardinality = distributed.cardinality

    def __iter__(self):
        return iter(self._worker_dataset)

    @property
    def element_spec(self):
        return self._worker_dataset.element_spec

    @property
    def cardinality(self):
        return self._worker_cardinality


def worker_dataset(distributed):
    """The dataset this worker reads of `distributed` (one input worker per process).

    None where the strategy's iterator handles partial batches (a dataset not
    known to be infinite under a multi-worker strategy: the workers agree on
    the end of the data in every step, and one that ran out gets an empty
    batch): only the strategy's iterator does that.
    """
    if getattr(distributed, "_enable_get_next_as_optional", True):
        return None
    return _WorkerDataset(distributed)
