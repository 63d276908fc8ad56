"""A session program in the shape of Rec SDK's DLRM / DCNv2 samples, run by the compat run module.

The program (written here) takes its Config, pipeline and evaluation from
`mx_rec.util.model_common`, regularises with `tf.contrib.layers`, wraps its
optimizers in loss-scale wrappers that divide the learning-rate fields, and
trains to the end of its data with a session, as the samples do.
"""

import os
import subprocess
import sys
import textwrap

from tests.compat.test_model_common import _write_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent(
    """
    import tensorflow as tf
    from npu_bridge.npu_init import *

    from mx_rec.core.asc.manager import start_asc_pipeline
    from mx_rec.core.embedding import create_table, sparse_lookup
    from mx_rec.optimizers.lazy_adam import create_hash_optimizer
    from mx_rec.util.initialize import ConfigInitializer, init, terminate_config_initializer
    import mx_rec.util as mxrec_util
    from mx_rec.util.variable import get_dense_and_sparse_variable
    import mx_rec.util.model_common as cm
    from mx_rec.util.model_common import (
        Config, create_feature_spec_list, evaluate, make_batch_and_iterator, sess_config
    )

    class Scaled:
        def __init__(self, opt, scale, field):
            self.opt, self.scale = opt, scale
            setattr(opt, field, getattr(opt, field) / scale)

        def compute_gradients(self, loss, var_list):
            return self.opt.compute_gradients(loss * self.scale, var_list=var_list)

        def apply_gradients(self, pairs):
            return self.opt.apply_gradients(pairs)

    cm.MODEL_NAME = "DCNv2"
    cm.eval_steps = 100
    init(train_steps=4, eval_steps=cm.eval_steps, use_dynamic=True,
         use_dynamic_expansion=cm.use_dynamic_expansion, use_shm_swap=cm.use_shm_swap)
    ConfigInitializer.get_instance().if_load = False
    assert mxrec_util.communication.hccl_ops.get_rank_id() == 0
    cfg = Config()
    specs = create_feature_spec_list(cfg, use_timestamp=False)
    train_batch, train_it = make_batch_and_iterator(cfg, specs, is_training=True, dump_graph=True)
    eval_batch, eval_it = make_batch_and_iterator(cfg, specs, is_training=False, dump_graph=False)
    table = create_table(key_dtype=cfg.key_type, dim=tf.TensorShape([cfg.emb_dim]),
                         name="sparse_embeddings",
                         emb_initializer=tf.variance_scaling_initializer(
                             mode="fan_avg", distribution="normal", seed=1),
                         **cfg.get_emb_table_cfg())

    def forward(batch, is_train):
        emb = sparse_lookup(table, specs[0], cfg.send_count, dim=None, is_train=is_train,
                            name="lookup", modify_graph=False, batch=batch,
                            access_and_evict_config=None)
        with tf.variable_scope("mlp", reuse=tf.AUTO_REUSE):
            w = tf.get_variable("w", [13, 1], initializer=tf.zeros_initializer(),
                                regularizer=tf.contrib.layers.l1_regularizer(1e-2))
            logit = tf.reduce_sum(emb, [1, 2])[:, None] * 0.1 + tf.matmul(
                tf.math.log1p(batch["dense_feature"]), w)
        label = tf.cast(batch["label"], tf.float32)
        loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit)
        return {"loss": loss, "pred": tf.sigmoid(logit), "label": label}

    train_model, eval_model = forward(train_batch, True), forward(eval_batch, False)
    dense_vars, sparse_vars = get_dense_and_sparse_variable()
    dense_opt = Scaled(tf.train.AdamOptimizer(cfg.learning_rate[0] / 100), 64.0, "_lr")
    sparse_opt = Scaled(create_hash_optimizer(learning_rate=cfg.learning_rate[1] / 100), 64.0,
                        "_learning_rate")
    loss = tf.reduce_mean(train_model["loss"]) + tf.add_n(
        tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES))
    grads = dense_opt.compute_gradients(loss, var_list=dense_vars + sparse_vars)
    ops = [dense_opt.apply_gradients([(g / 64.0, v) for g, v in grads[:-1]])]
    ops.append(sparse_opt.apply_gradients([(grads[-1][0], sparse_vars[0])]))
    ops += [cfg.global_step.assign(cfg.global_step + 1)]
    with tf.control_dependencies(ops):
        train_op = tf.no_op()
    start_asc_pipeline()
    sess = tf.Session(config=sess_config(dump_data=False))
    sess.run([tf.global_variables_initializer(), train_it.initializer])
    train_op = util.set_iteration_per_loop(sess, train_op, 10)
    runs = 0
    while True:
        try:
            sess.run(train_op)
            runs += 1
        except tf.errors.OutOfRangeError:
            break
    auc, mean_loss = evaluate(sess, eval_model, eval_it, cfg)
    print("runs", runs, "name", table.table_name,
          "size", table.size(), "capacity", table.capacity(), "auc", 0 <= auc <= 1,
          "loss", mean_loss > 0)
    sess.close()
    terminate_config_initializer()
    """
)


def test_a_dcnv2_shaped_session_program_trains_and_evaluates(tmp_path):
    _write_records(tmp_path / "data" / "train", rows=12)
    _write_records(tmp_path / "data" / "test", rows=4)
    program = tmp_path / "main_mxrec.py"
    program.write_text(PROGRAM)
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "CUDA_VISIBLE_DEVICES": "",
        "TRAIN_RANK_SIZE": "1",
        "CACHE_MODE": "HBM",
        "DLRM_CRITEO_DATA_PATH": str(tmp_path / "data"),
        "BATCH_SIZE": "8",
        "LINE_PER_SAMPLE": "2",
        "EMB_DIM": "4",
        "DEV_VOCAB_SIZE": "1024",
    }
    out = subprocess.run(
        [sys.executable, "-m", "npu_rec.compat.run", str(program)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # 12 records x 2 samples x 3 epochs / 8 per batch: 9 runs; 26 ids per sample, all new.
    assert "runs 9 name sparse_embeddings size 624 capacity 1024 " in out.stdout
    assert "auc True loss True" in out.stdout
