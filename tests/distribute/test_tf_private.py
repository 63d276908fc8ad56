"""The TensorFlow internals fenced in `npu_rec/distribute/_tf_private.py` still work."""

import tensorflow as tf

from npu_rec.distribute import _tf_private


def test_variables_made_outside_the_strategy_are_plain_inside_its_scope():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = tf.Variable(1.0)
        with _tf_private.outside_strategy():
            plain = tf.Variable(tf.zeros([3]), trainable=False)
            grows = tf.Variable(tf.zeros([2, 4]), shape=tf.TensorShape([None, 4]))
    assert type(mirrored).__name__ == "MirroredVariable", (
        f"TensorFlow {tf.__version__}: the strategy no longer mirrors; check this test"
    )
    assert type(plain).__name__ == "ResourceVariable", (
        f"TensorFlow {tf.__version__} changed the default variable creator: fix "
        "_tf_private.outside_strategy"
    )
    assert grows.shape.as_list() == [None, 4]
    plain.assign_add(tf.ones([3]))
    assert plain.numpy().tolist() == [1.0, 1.0, 1.0]


def test_a_strategy_without_options_has_no_timeout():
    assert _tf_private.strategy_timeout(tf.distribute.get_strategy()) is None


def test_the_raw_collective_of_the_exchange_takes_the_arguments_it_passes():
    import inspect

    for name in ("CollectiveAllToAllV2",):
        op = getattr(tf.raw_ops, name, None)
        assert op is not None, f"TensorFlow {tf.__version__} has no tf.raw_ops.{name}"
        params = set(inspect.signature(op).parameters)
        wanted = {
            "input",
            "group_size",
            "group_key",
            "instance_key",
            "ordering_token",
            "communication_hint",
            "timeout_seconds",
        }
        assert wanted <= params, (
            f"TensorFlow {tf.__version__}: tf.raw_ops.{name} lost {sorted(wanted - params)}; "
            "fix npu_rec/distribute/_exchange.py"
        )


def test_a_workers_dataset_reads_the_distributed_batches_and_keras_takes_it():
    import itertools

    from keras.src.trainers import data_adapters

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    ds = tf.data.Dataset.range(10).batch(4).repeat()
    worker = _tf_private.worker_dataset(strategy.experimental_distribute_dataset(ds))
    assert worker is not None, (
        f"TensorFlow {tf.__version__}: fix worker_dataset in npu_rec/distribute/_tf_private.py"
    )
    got = [b.numpy().tolist() for b in itertools.islice(worker, 4)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    assert isinstance(worker, tf.distribute.DistributedDataset)
    assert data_adapters.is_tf_dataset(worker), "Keras no longer takes it as a dataset"
    assert int(worker.cardinality) == int(tf.data.INFINITE_CARDINALITY)
    assert worker.element_spec == ds.element_spec


def test_a_finite_dataset_under_a_multi_worker_strategy_keeps_the_strategys_iterator():
    class Distributed:  # the strategy's verdict for a finite multi-worker dataset
        _enable_get_next_as_optional = True

    assert _tf_private.worker_dataset(Distributed()) is None
