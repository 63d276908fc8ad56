"""npu_rec.compat.mx_rec against mx_rec's documented behaviour, and the run module."""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.compat.mx_rec.core.asc.feature_spec import FeatureSpec
from npu_rec.compat.mx_rec.core.embedding import create_table, sparse_lookup
from npu_rec.compat.mx_rec.optimizers import (
    adagrad,
    ftrl,
    gradient_descent,
    gradient_descent_by_addr,
    lazy_adam,
    lazy_adam_by_addr,
)
from npu_rec.compat.mx_rec.optimizers.base import CustomizedOptimizer
from npu_rec.compat.mx_rec.util.variable import get_dense_and_sparse_variable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        (lambda: gradient_descent.create_hash_optimizer(0.1), npu_rec.optimizers.SGD),
        (
            lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1),
            npu_rec.optimizers.SGD,
        ),
        (lambda: lazy_adam.create_hash_optimizer(0.1), npu_rec.optimizers.Adam),
        (lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(0.1), npu_rec.optimizers.Adam),
        (lambda: adagrad.create_hash_optimizer(0.1), npu_rec.optimizers.Adagrad),
        (lambda: ftrl.create_hash_optimizer(0.1), npu_rec.optimizers.Ftrl),
    ],
)
def test_each_module_gives_the_optimizer_it_names(make, rule):
    opt = make()
    assert isinstance(opt, tf.compat.v1.train.Optimizer)
    assert isinstance(opt, CustomizedOptimizer)
    assert type(opt.sparse_optimizer) is rule
    assert opt._lr == 0.1


def test_weight_decay_defaults():
    assert gradient_descent.create_hash_optimizer(0.1).sparse_optimizer.weight_decay == 0.0
    assert (
        gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1).sparse_optimizer.weight_decay
        == 1e-4
    )


def test_create_table_maps_and_refuses():
    t = create_table(
        tf.int64,
        tf.TensorShape([8]),
        "ct",
        tf.compat.v1.truncated_normal_initializer(),
        device_vocabulary_size=100,
        shard_num=2,
    )
    assert (t.table_name, t.dim, t.capacity()) == ("ct", 8, 100)
    assert t.core.num_shards == 2 and t.core.config.capacity == 100
    with pytest.raises(ValueError, match="value_dtype"):
        create_table(tf.int64, 8, "c2", None, device_vocabulary_size=10, value_dtype=tf.int32)
    half = create_table(tf.int64, 8, "c5", None, device_vocabulary_size=10, value_dtype=tf.float16)
    assert half.core.config.value_dtype == tf.float16
    emb = sparse_lookup(half, tf.constant([[1, 2]], tf.int64), is_train=False)
    assert emb.dtype == tf.float32
    host = create_table(tf.int64, 8, "c3", None, device_vocabulary_size=10, host_vocabulary_size=5)
    assert host.capacity() == 15  # device and host rows are both process memory
    with pytest.raises(ValueError, match="ssd_data_path"):
        create_table(tf.int64, 8, "c6", None, device_vocabulary_size=10, ssd_vocabulary_size=10)
    with pytest.raises(TypeError, match="unexpected"):
        create_table(tf.int64, 8, "c4", None, bogus=1)


def test_faae_coefficient_with_admission_is_refused():
    t = create_table(tf.int64, 4, "faae", None, device_vocabulary_size=10)
    spec = FeatureSpec("f", table_name="faae", access_threshold=2, faae_coefficient=4)
    with pytest.raises(ValueError, match="faae_coefficient"):
        sparse_lookup(t, spec, batch={"f": tf.constant([[1]], tf.int64)})


def test_program_trains_with_the_optimizer_it_asks_for():
    """The mx_rec training step: SGD on the table, Adam on dense, numbers checked."""
    g = tf.Graph()
    with g.as_default():
        table = create_table(
            tf.int64,
            tf.TensorShape([2]),
            "user",
            tf.compat.v1.constant_initializer(1.0),
            device_vocabulary_size=32,
        )
        batch = {"user": tf.constant([[1, 2], [2, 3]], tf.int64)}
        spec = FeatureSpec("user", table_name="user")
        emb = sparse_lookup(table, spec, None, is_train=True, batch=batch)
        assert emb.shape.as_list() == [2, 2, 2]
        ev = sparse_lookup(
            table,
            tf.constant([[9]], tf.int64),
            None,
            is_train=False,
            serving_default_value=tf.ones([2]) * 2,
        )
        loss = tf.reduce_sum(emb)
        dense, sparse = get_dense_and_sparse_variable()
        assert dense == [] and len(sparse) == 1
        lr = tf.constant(0.5)
        opt = gradient_descent.create_hash_optimizer(learning_rate=lr)
        op = opt.apply_gradients(list(zip(tf.gradients(loss, sparse), sparse, strict=True)))
        sess = tf.compat.v1.Session()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(op)
        assert table.size() == 3  # no session passed: the graph's open session
        np.testing.assert_allclose(sess.run(ev), [[[2.0, 2.0]]])
        state = table.core.export(session=sess)
        order = np.argsort(state["keys"])
        # key 2 appears twice: grad 2; others once
        np.testing.assert_allclose(state["values"][order][:, 0], [0.5, 0.0, 0.5])
        assert type(table.core.optimizer) is npu_rec.optimizers.SGD
        sess.close()


def test_program_subclass_rule_runs_on_rows():
    """A program's own CustomizedOptimizer subclass (GradientDescent with decay)."""
    from tensorflow.python.training import gradient_descent as gd

    class Decayed(gd.GradientDescentOptimizer, CustomizedOptimizer):
        def __init__(self, learning_rate):
            self._get_name("Decayed")
            super().__init__(learning_rate=learning_rate, name=self.unique_name)

        def get_slot_init_values(self):
            return []

        def _apply_sparse_duplicate_indices(self, grad, var):
            value = (grad.values + 0.1 * tf.gather(var, grad.indices)) * self._learning_rate_tensor
            return tf.compat.v1.scatter_nd_add(var, tf.expand_dims(grad.indices, 1), -value)

    g = tf.Graph()
    with g.as_default():
        table = create_table(
            tf.int64, 1, "sub", tf.compat.v1.constant_initializer(1.0), device_vocabulary_size=8
        )
        emb = sparse_lookup(table, tf.constant([4], tf.int64), None, is_train=True)
        _, sparse = get_dense_and_sparse_variable()
        op = Decayed(0.5).apply_gradients(
            zip(tf.gradients(tf.reduce_sum(emb), sparse), sparse, strict=True)
        )
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            np.testing.assert_allclose(table.core.export(session=sess)["values"], [[1 - 0.5 * 1.1]])


PROGRAM = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    from npu_bridge.npu_init import *
    assert tf is sys.modules["tensorflow"].compat.v1 and not tf.executing_eagerly()
    assert util.set_iteration_per_loop(None, "op", 1) == "op" and npu_hooks_append([1]) == [1]
    assert callable(npu_plugin.set_device_sat_mode) and callable(npu_ops.dropout)
    assert hccl_ops.allreduce(tf.constant(1.0), "sum") is not None
    assert sys.modules["tensorflow"].estimator.ModeKeys.TRAIN == "train"
    from mx_rec.util.initialize import init, get_rank_size, terminate_config_initializer
    from mx_rec.core.embedding import create_table, sparse_lookup
    from mx_rec.core.asc.feature_spec import FeatureSpec
    from mx_rec.core.asc.helper import get_asc_insert_func
    from mx_rec.core.asc.manager import start_asc_pipeline
    from mx_rec.util.variable import get_dense_and_sparse_variable
    from mx_rec.optimizers.lazy_adam import create_hash_optimizer

    init(train_steps=4, eval_steps=1, use_dynamic=True, use_dynamic_expansion=False)
    specs = [FeatureSpec("ids", table_name="t")]
    ds = tf.data.Dataset.from_tensors({"ids": tf.constant([[1, 2]], tf.int64), "y": tf.constant([1.0])})
    ds = ds.repeat(4).map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    batch = it.get_next()
    table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([4]), name="t",
                         emb_initializer=tf.compat.v1.truncated_normal_initializer(),
                         device_vocabulary_size=16 * get_rank_size())
    emb = sparse_lookup(table, specs[0], 8, is_train=True, batch=batch)
    logit = tf.compat.v1.layers.dense(tf.reduce_sum(emb, [1]), 1)[:, 0] if False else tf.reduce_sum(emb, [1, 2])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["y"], logits=logit))
    dense, sparse = get_dense_and_sparse_variable()
    train = create_hash_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, sparse), sparse, strict=True))
    start_asc_pipeline()
    sess = tf.Session()
    sess.run([tf.global_variables_initializer(), it.initializer])
    losses = [sess.run([train, loss])[1] for _ in range(4)]
    assert losses[-1] < losses[0], losses
    print("argv", sys.argv[1:], "size", table.size())
    terminate_config_initializer()
    """
)


def test_run_module_runs_an_unchanged_program(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": ROOT, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-m", "npu_rec.compat.run", str(program), "--flag", "x"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "argv ['--flag', 'x'] size 2" in out.stdout
    # Only in that process: here `mx_rec` is not importable.
    with pytest.raises(ImportError):
        __import__("mx_rec")


def test_slicer_hooks_accept_their_arguments_and_leave_the_graph_alone():
    from npu_rec.compat.mx_rec.graph.hooks import (
        LookupSubgraphSlicerHook,
        OrphanLookupKeySlicerHook,
    )

    with tf.Graph().as_default() as graph:
        ids = tf.strings.to_number(tf.strings.as_string(tf.constant([1, 2], tf.int64)), tf.int64)
        before = [op.name for op in graph.get_operations()]
        hooks = [OrphanLookupKeySlicerHook(), LookupSubgraphSlicerHook(op_types=["StringToNumber"])]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
            assert list(sess.run(ids)) == [1, 2]
        assert hooks[1].op_types == ["StringToNumber"]
        assert [op.name for op in graph.get_operations()][: len(before)] == before


def test_config_initializer_reads_static_flag_and_channel_ids():
    from npu_rec.compat.mx_rec.constants.constants import LIBREC_CPU_SO
    from npu_rec.compat.mx_rec.util.initialize import (
        ConfigInitializer,
        init,
        terminate_config_initializer,
    )
    from npu_rec.compat.mx_rec.util.ops import import_host_pipeline_ops

    for use_dynamic in (True, False):
        init(train_steps=2, eval_steps=1, use_dynamic=use_dynamic)
        try:
            config = ConfigInitializer.get_instance()
            assert config.use_static is (not use_dynamic)
            params = config.train_params_config
            assert params.get_training_mode_channel_id(True) == 0
            assert params.get_training_mode_channel_id(False) == 1
            for refused in (params.get_initializer, params.get_target_batch):
                with pytest.raises(ValueError, match="does not modify the graph"):
                    refused(False)
        finally:
            terminate_config_initializer()
    ops = import_host_pipeline_ops(LIBREC_CPU_SO)
    assert ops.clear_channel(1) is None
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        stamps = sess.run(ops.return_timestamp(tf.constant([0, 1, 1], tf.int64)))
    assert stamps.shape == (3,) and len(set(stamps)) == 1 and stamps[0] > 1_600_000_000


def test_eos_map_keeps_every_element_and_the_end():
    import npu_rec.compat.mx_rec  # noqa: F401  (adds eos_map, as importing mx_rec does)
    from npu_rec.compat.mx_rec.constants.constants import LIBREC_EOS_OPS_SO
    from npu_rec.compat.mx_rec.util.ops import import_host_pipeline_ops

    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    ds = tf.data.Dataset.range(5).batch(2).eos_map(librec, 0, 100, 10)
    assert [list(b) for b in ds.as_numpy_iterator()] == [[0, 1], [2, 3], [4]]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        it = tf.compat.v1.data.make_initializable_iterator(
            tf.compat.v1.data.Dataset.range(3).eos_map(librec, 1, 100, 10)
        )
        nxt = it.get_next()
        sess.run(it.initializer)
        assert [sess.run(nxt) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(nxt)


def test_util_package_reaches_rank_helpers_as_attributes():
    import npu_rec.compat.mx_rec.util as mxrec_util

    assert mxrec_util.communication.hccl_ops.get_rank_id() == 0
    assert mxrec_util.communication.hccl_ops.get_rank_size() == 1


def test_init_accepts_the_shm_swap_and_mpi_settings_and_reads_them_back():
    from npu_rec.compat.mx_rec.util.initialize import (
        ConfigInitializer,
        init,
        terminate_config_initializer,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "unknown setting" warning for mx_rec's own settings
        init(train_steps=2, eval_steps=1, use_shm_swap=True, use_lccl=False, use_mpi=False)
    try:
        assert ConfigInitializer.get_instance().use_shm_swap is True
        assert ConfigInitializer.get_instance().use_mpi is False
        assert npu_rec.get_config().train_steps == 2
    finally:
        terminate_config_initializer()
    with pytest.raises(TypeError, match=r"use_shm_swap"):
        init(train_steps=2, use_shm_swap="yes")
    with pytest.raises(TypeError, match=r"use_mpi"):
        init(train_steps=2, use_mpi=1)


def test_a_made_hash_optimizer_is_the_registered_instance():
    from npu_rec.compat.mx_rec.util.initialize import ConfigInitializer

    config = ConfigInitializer.get_instance()
    opt = lazy_adam.create_hash_optimizer(0.1)
    assert config.optimizer_config.optimizer_instance is opt
    config.optimizer_config.optimizer_instance = "mine"  # a program's own optimizer sets it
    assert ConfigInitializer.get_instance().optimizer_config.optimizer_instance == "mine"


@pytest.mark.parametrize("field", ["_lr", "_learning_rate"])
def test_scaling_the_learning_rate_field_scales_the_row_update(field):
    """The samples' loss-scale wrappers: gradients x S, the rate field / S, same update."""
    g = tf.Graph()
    with g.as_default():
        table = create_table(
            tf.int64, 1, "scaled", tf.compat.v1.constant_initializer(1.0), device_vocabulary_size=8
        )
        emb = sparse_lookup(table, tf.constant([3], tf.int64), None, is_train=True)
        _, sparse = get_dense_and_sparse_variable()
        opt = gradient_descent.create_hash_optimizer(learning_rate=tf.constant(0.5))
        setattr(opt, field, getattr(opt, field) / 1024.0)
        assert opt._lr is opt._learning_rate is opt.sparse_optimizer.learning_rate
        grads = tf.gradients(1024.0 * tf.reduce_sum(emb), sparse)
        op = opt.apply_gradients(zip(grads, sparse, strict=True))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            np.testing.assert_allclose(table.core.export(session=sess)["values"], [[0.5]])
    with pytest.raises(ValueError, match="learning_rate"):
        opt._lr = -1.0


def test_an_ssd_tier_maps_to_a_tiered_table(tmp_path):
    from npu_rec.compat.mx_rec.optimizers.adagrad import create_hash_optimizer

    t = create_table(
        tf.int64,
        4,
        "ssd",
        None,
        device_vocabulary_size=2,
        host_vocabulary_size=1,
        ssd_vocabulary_size=100,
        ssd_data_path=[str(tmp_path)],
        optimizer_list=[create_hash_optimizer(0.1)],
    )
    ids = tf.constant([[1, 2], [3, 4], [5, 6]], tf.int64)
    emb = sparse_lookup(t, ids)
    assert emb.shape == (3, 2, 4)
    assert (t.core.config.memory_rows, t.core.config.ssd_path) == (3, (str(tmp_path),))
    sparse_lookup(t, tf.constant([[7], [8]], tf.int64))
    assert t.size() == 8 and t.core.tier_stats()["cold_keys"] >= 5
