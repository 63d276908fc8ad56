"""NPUEstimator end to end: train/evaluate/predict/export, resume, checkpoints, init rules."""

import concurrent.futures
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from npu_rec.data import load_sample
from tests.estimator import models

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _est(model_dir, params=None, **config):
    config.setdefault("log_step_count_steps", None)
    return E.NPUEstimator(
        models.deepfm_model_fn,
        params=params or {},
        config=E.NPURunConfig(model_dir=str(model_dir), random_seed=1, **config),
    )


def _serving_fn():
    return E.build_raw_serving_input_receiver_fn(
        {"cat": tf.TensorSpec([None, 26], tf.int64), "dense": tf.TensorSpec([None, 13])}
    )


def test_deepfm_synthetic_train_evaluate_predict_export(tmp_path):
    est = _est(tmp_path)
    est.train(models.synthetic_input_fn(0, 6400, epochs=3), max_steps=300)
    result = est.evaluate(models.synthetic_input_fn(6400, 9600), steps=40)
    assert set(result) >= {"loss", "auc", "global_step"}
    assert result["global_step"] == 300 and result["auc"] > 0.65
    features, _ = models.synthetic_arrays(6400, 6464)
    preds = list(est.predict(models.make_input_fn(features, np.zeros(64, np.int64))))
    assert len(preds) == 64 and set(preds[0]) == {"probabilities", "logits"}
    export = est.export_saved_model(str(tmp_path / "export"), _serving_fn())
    assert isinstance(export, bytes)
    unknown = np.full([2, 26], 123456789, np.int64)  # never seen: embeddings read zeros
    code = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf
        f = tf.saved_model.load({export.decode()!r}).signatures["serving_default"]
        cat = np.load({str(tmp_path / "cat.npy")!r}); dense = np.load({str(tmp_path / "d.npy")!r})
        out = f(cat=tf.constant(cat), dense=tf.constant(dense))["probabilities"].numpy()
        np.save({str(tmp_path / "out.npy")!r}, out)
        assert "npu_rec" not in sys.modules
    """)
    np.save(tmp_path / "cat.npy", np.concatenate([features["cat"][:8], unknown]))
    np.save(tmp_path / "d.npy", np.concatenate([features["dense"][:8], features["dense"][:2]]))
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
    served = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(served[:8], [p["probabilities"] for p in preds[:8]], atol=1e-6)
    # Unknown ids: the same as a model whose sparse rows are all zero.
    fm_free = est.get_variable_value("bias")
    assert np.all(np.isfinite(served[8:])) and fm_free.shape == (1,)


def test_deepfm_criteo_sample_with_optimizer_minimize(tmp_path):
    """optimizer.minimize(loss) still updates the tables (the Estimator adds the sparse step)."""
    data = load_sample("criteo_sample")
    cat = np.stack([data[f"C{i}"] for i in range(1, 27)], 1).astype(np.int64)
    dense = np.log1p(np.maximum(np.stack([data[f"I{i}"] for i in range(1, 14)], 1), 0))
    features = {"cat": cat, "dense": dense.astype(np.float32)}
    labels = np.asarray(data["label"], np.int64)
    est = _est(tmp_path, params={"use_minimize": True})
    input_fn = models.make_input_fn(features, labels, batch_size=32, epochs=5)
    est.train(input_fn, steps=20)
    before = _table_rows(tmp_path, 20)
    est.train(input_fn, steps=10)
    after = _table_rows(tmp_path, 30)
    assert before.shape == after.shape and not np.allclose(before, after)
    assert np.isfinite(est.evaluate(models.make_input_fn(features, labels, 32))["loss"])
    assert (
        len(list(est.predict(models.make_input_fn(features, labels, 32)))) == len(labels) // 32 * 32
    )
    assert est.export_saved_model(str(tmp_path / "export"), _serving_fn())


def _table_rows(model_dir, step):
    from npu_rec.checkpoint import _file_format

    arrays, _ = _file_format.read_file(
        os.path.join(model_dir, "tables", f"ckpt-{step:012d}.full.nrc")
    )
    table = _file_format.table_state("cat", arrays)
    return table["values"][np.argsort(table["keys"])]


_RESUME = """
import sys
sys.path.insert(0, {root!r})
import tensorflow as tf
import npu_rec
from npu_rec import estimator as E
from tests.estimator import models
est = E.NPUEstimator(models.deepfm_model_fn, params={{}}, config=E.NPURunConfig(
    model_dir={model_dir!r}, random_seed=1, log_step_count_steps=None))
est.train(models.synthetic_input_fn(0, 6400, epochs=4), max_steps={max_steps})
"""


def _run(model_dir, max_steps):
    code = _RESUME.format(root=ROOT, model_dir=str(model_dir), max_steps=max_steps)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=240)


def _train_here(model_dir, max_steps):
    npu_rec.shutdown()
    est = E.NPUEstimator(
        models.deepfm_model_fn,
        params={},
        config=E.NPURunConfig(model_dir=str(model_dir), random_seed=1, log_step_count_steps=None),
    )
    est.train(models.synthetic_input_fn(0, 6400, epochs=4), max_steps=max_steps)
    npu_rec.shutdown()


def test_interrupt_and_resume_matches_one_run(tmp_path):
    """100 data batches repeat, so steps 100-199 see the same batches in both runs.

    The uninterrupted run and the first 100 steps run in this process; the
    last 100 in a new process, which has only the checkpoint to go on (it runs
    while this process trains the uninterrupted run).
    """
    _train_here(tmp_path / "twice", 100)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        resumed = pool.submit(_run, tmp_path / "twice", 200)
        _train_here(tmp_path / "once", 200)
        resumed.result()
    ckpt_a = tf.train.latest_checkpoint(str(tmp_path / "once"))
    ckpt_b = tf.train.latest_checkpoint(str(tmp_path / "twice"))
    assert ckpt_a.endswith("-200") and ckpt_b.endswith("-200")
    for name, _ in tf.train.list_variables(ckpt_a):
        np.testing.assert_allclose(
            tf.train.load_variable(ckpt_b, name),
            tf.train.load_variable(ckpt_a, name),
            atol=1e-6,
            err_msg=name,
        )
    np.testing.assert_allclose(
        _table_rows(tmp_path / "twice", 200), _table_rows(tmp_path / "once", 200), atol=1e-6
    )


def test_init_settings_example_checkpoints_at_100_and_200(tmp_path):
    npu_rec.init(
        max_steps=200,
        train_steps=100,
        eval_steps=10,
        save_steps=100,
        use_dynamic=True,
        use_dynamic_expansion=False,
        bind_cpu=False,
    )
    est = _est(tmp_path, save_checkpoints_steps=100)
    est.train(models.synthetic_input_fn(0, 3200, epochs=4), max_steps=200)
    steps = sorted(
        int(f.split("-")[1].split(".")[0])
        for f in os.listdir(tmp_path)
        if f.startswith("model.ckpt-") and f.endswith(".index")
    )
    assert steps == [100, 200]
    tables = sorted(os.listdir(tmp_path / "tables"))
    assert tables == ["ckpt-000000000100.full.nrc", "ckpt-000000000200.full.nrc"]


def test_init_save_steps_drives_the_cadence(tmp_path):
    npu_rec.init(save_steps=30, bind_cpu=False)
    est = _est(tmp_path)
    est.train(models.synthetic_input_fn(0, 3200, epochs=2), max_steps=60)
    assert [v for v in sorted(os.listdir(tmp_path / "tables"))] == [
        "ckpt-000000000030.full.nrc",
        "ckpt-000000000060.full.nrc",
    ]


def test_init_and_run_config_disagree(tmp_path):
    npu_rec.init(save_steps=100, bind_cpu=False)
    est = _est(tmp_path, save_checkpoints_steps=50)
    with pytest.raises(npu_rec.ConfigError, match="save_checkpoints_steps=50"):
        est.train(models.synthetic_input_fn(), max_steps=10)


def test_incremental_full_and_delta_then_restore_version(tmp_path, monkeypatch):
    from npu_rec.estimator import _hooks

    now = [0.0]

    def fake_clock():
        now[0] += 1.0  # every clock reading is one second later
        return now[0]

    monkeypatch.setattr(_hooks, "clock", fake_clock)
    npu_rec.init(
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=40,
        save_delta_checkpoints_secs=10,
        bind_cpu=False,
    )
    est = _est(tmp_path, save_checkpoints_steps=1000)
    est.train(models.synthetic_input_fn(0, 3200), max_steps=40)
    kinds = [f.split(".")[1] for f in sorted(os.listdir(tmp_path / "tables"))]
    assert "full" in kinds and "delta" in kinds
    versions = [int(f[5:17]) for f in sorted(os.listdir(tmp_path / "tables"))]
    n = [v for v, k in zip(versions, kinds, strict=True) if k == "delta"][0]
    expected = _table_rows_at(tmp_path, n)
    dense = tf.train.load_variable(str(tmp_path / f"model.ckpt-{n}"), "w_out")
    npu_rec.shutdown()
    npu_rec.init(if_load=True, restore_model_version=n, bind_cpu=False)
    seen = {}

    class Capture(tf.compat.v1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            graph = session.graph
            seen["step"] = session.run(tf.compat.v1.train.get_global_step())
            seen["w_out"] = session.run(
                graph.get_tensor_by_name("w_out:0").op.outputs[0] if False else _var(graph, "w_out")
            )
            table = npu_rec.table._registry.get("cat")
            st = table.export(session=session)
            seen["rows"] = st["values"][np.argsort(st["keys"])]

    _est(tmp_path, save_checkpoints_steps=1000).train(
        models.synthetic_input_fn(0, 3200), hooks=[Capture()], steps=1
    )
    assert seen["step"] == n
    np.testing.assert_array_equal(seen["w_out"], dense)
    np.testing.assert_array_equal(seen["rows"], expected)


def _var(graph, name):
    return [v for v in tf.compat.v1.global_variables() if v.op.name == name][0]


def _table_rows_at(model_dir, version):
    from npu_rec.checkpoint import TableCheckpointManager

    g = tf.Graph()
    with g.as_default():
        table = npu_rec.create_table("cat", 4, optimizer=npu_rec.optimizers.Adagrad(0.05))
        manager = TableCheckpointManager(str(model_dir / "tables"), [table])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            manager.restore(version, session=sess)
            st = table.export(session=sess)
    return st["values"][np.argsort(st["keys"])]


def test_restore_model_version_missing_names_existing(tmp_path):
    est = _est(tmp_path, save_checkpoints_steps=10)
    est.train(models.synthetic_input_fn(0, 1280), max_steps=20)
    npu_rec.init(if_load=True, restore_model_version=15, bind_cpu=False)
    with pytest.raises(npu_rec.ConfigError, match=r"restore_model_version=15.*tables \[10, 20\]"):
        est.train(models.synthetic_input_fn(0, 1280), max_steps=30)


def test_steps_and_max_steps_rules(tmp_path):
    est = _est(tmp_path)
    with pytest.raises(ValueError, match="Can not provide both steps and max_steps"):
        est.train(models.synthetic_input_fn(), steps=1, max_steps=2)
    with pytest.raises(ValueError, match=r"`steps` must be .*Received: steps=0"):
        est.train(models.synthetic_input_fn(), steps=0)
    with pytest.raises(ValueError, match=r"`max_steps` must be .*Received: max_steps=-1"):
        est.train(models.synthetic_input_fn(), max_steps=-1)
    est.train(models.synthetic_input_fn(0, 640), steps=3)
    est.train(models.synthetic_input_fn(0, 640), steps=2)
    assert est.latest_checkpoint().endswith("model.ckpt-5")
    est.train(models.synthetic_input_fn(0, 640), max_steps=5)  # already there: no-op
    assert est.latest_checkpoint().endswith("model.ckpt-5")


def test_model_dir_mismatch_and_temp_dir(tmp_path):
    with pytest.raises(ValueError, match="`model_dir` are set both in constructor and"):
        E.NPUEstimator(
            models.deepfm_model_fn,
            model_dir=str(tmp_path / "a"),
            config=E.NPURunConfig(model_dir=str(tmp_path / "b")),
        )
    est = E.NPUEstimator(models.deepfm_model_fn)
    assert os.path.isdir(est.model_dir) and "npu_rec_model_" in est.model_dir


def test_user_hooks_called_in_order_and_iterations_per_loop(tmp_path):
    calls, steps = [], []

    class Hook(tf.compat.v1.train.SessionRunHook):
        def __init__(self, name):
            self.name = name

        def begin(self):
            self._step = tf.compat.v1.train.get_global_step()

        def before_run(self, run_context):
            calls.append(self.name)

        def after_run(self, run_context, run_values):
            if self.name == "a":
                steps.append(int(run_context.session.run(self._step)))

    est = _est(tmp_path, iterations_per_loop=4)
    est.train(models.synthetic_input_fn(0, 3200), hooks=[Hook("a"), Hook("b")], max_steps=10)
    assert calls == ["a", "b"] * 3  # loops of 4, 4, 2 steps
    assert steps == [4, 8, 10]  # one hooked run advances the global step by N
    assert est.latest_checkpoint().endswith("model.ckpt-10")


def test_train_and_evaluate(tmp_path):
    npu_rec.init(max_steps=40, train_steps=20, eval_steps=5, save_steps=20, bind_cpu=False)
    est = _est(tmp_path, save_checkpoints_steps=20)
    result, _ = E.train_and_evaluate(
        est,
        E.TrainSpec(models.synthetic_input_fn(0, 3200), max_steps=40),
        E.EvalSpec(models.synthetic_input_fn(3200, 6400), steps=5),
    )
    assert result["global_step"] == 40
    assert os.path.isdir(tmp_path / "eval")


def test_evict_hook_evicts_by_steps(tmp_path):
    def model_fn(features, labels, mode):
        table = npu_rec.create_table(
            "t", 2, optimizer=npu_rec.optimizers.SGD(0.1), access_threshold=0, eviction_threshold=0
        )
        emb = npu_rec.sparse_lookup(table, features["cat"], timestamps=features["ts"])
        loss = tf.reduce_mean(tf.square(emb))
        return E.EstimatorSpec(
            mode,
            loss=loss,
            train_op=E.sparse_train_op(
                loss,
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                tf.compat.v1.train.get_global_step(),
                var_list=[],
            ),
        )

    def input_fn():
        cat = np.arange(40, dtype=np.int64).reshape(20, 2)
        ts = np.arange(20, dtype=np.int64) * 100
        return tf.data.Dataset.from_tensor_slices(({"cat": cat, "ts": ts}, ts)).batch(2)

    hook = E.EvictHook(evict_enable=True, evict_step_interval=5)
    E.NPUEstimator(model_fn, model_dir=str(tmp_path)).train(input_fn, hooks=[hook], max_steps=10)
    assert [s for s, _ in hook.evictions] == [5, 10]
    assert all(freed > 0 for _, freed in hook.evictions)


def test_evict_hook_counts_session_runs_in_a_graph_without_global_step():
    """A plain session loop (mx_rec's session samples) has no global step: a run is a step."""
    with tf.Graph().as_default():
        table = npu_rec.create_table(
            "t", 2, optimizer=npu_rec.optimizers.SGD(0.1), access_threshold=0, eviction_threshold=0
        )
        ids = tf.compat.v1.placeholder(tf.int64, [2])
        emb = npu_rec.sparse_lookup(table, ids, timestamps=tf.cast(ids, tf.int64) * 100)
        train = tf.reduce_sum(emb)  # the lookup admits the keys
        hook = E.EvictHook(evict_enable=True, evict_step_interval=3)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            for i in range(7):
                sess.run(train, {ids: [2 * i, 2 * i + 1]})
    assert [s for s, _ in hook.evictions] == [3, 6]
    assert all(freed > 0 for _, freed in hook.evictions)


def test_restore_model_version_on_an_empty_model_dir_names_the_version_and_directory(tmp_path):
    est = _est(tmp_path / "empty")
    npu_rec.init(if_load=True, restore_model_version=5, bind_cpu=False)
    with pytest.raises(npu_rec.ConfigError, match=r"restore_model_version=5.*empty"):
        est.train(models.synthetic_input_fn(0, 1280), max_steps=20)
