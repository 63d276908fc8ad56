"""`WarmStartSettings` / `VocabInfo`, as tf.estimator's `warm_start_from`.

tf.estimator: while model_dir has no checkpoint, the variables chosen by
`vars_to_warm_start` (a regex over the trainable variables; a list of regexes
over all global ones) are initialised from the source checkpoint, renamed by
`var_name_to_prev_var_name` and remapped row by row to a new vocabulary by
`var_name_to_vocab_info` (new words get the backup initializer); the others
start as the model_fn initialises them. A plain path is `WarmStartSettings(path)`.
"""

import numpy as np
import pytest
import tensorflow as tf

from npu_rec import estimator as E

FC = tf.compat.v1.feature_column


def model_fn(features, labels, mode, params):
    column = FC.embedding_column(
        FC.categorical_column_with_vocabulary_file("word", params["vocab"]),
        dimension=2,
        initializer=tf.compat.v1.random_normal_initializer(seed=params["seed"]),
    )
    net = FC.input_layer(features, [column])
    scope = params.get("scope", "dense")
    with tf.compat.v1.variable_scope(scope):
        w = tf.compat.v1.get_variable(
            "w", [2, 1], initializer=tf.compat.v1.random_normal_initializer(seed=params["seed"])
        )
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.constant_initializer(0.5))
    pred = tf.matmul(net, w)[:, 0] + b
    if mode == E.ModeKeys.PREDICT:
        return E.EstimatorSpec(mode, predictions={"y": pred})
    loss = tf.reduce_mean(tf.square(pred - labels))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(params.get("lr", 0.1)).minimize(
        loss, tf.compat.v1.train.get_global_step()
    )
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
    words = np.array(["apple", "berry", "cherry", "apple"])
    return tf.data.Dataset.from_tensor_slices(({"word": words}, np.arange(4, dtype=np.float32)))


EMBEDDING = "input_layer/word_embedding/embedding_weights"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("source")
    vocab = root / "old_vocab.txt"
    vocab.write_text("apple\nberry\ncherry\n")
    est = E.Estimator(
        model_fn,
        model_dir=str(root / "m"),
        params={"vocab": str(vocab), "seed": 1},
        config=E.RunConfig(log_step_count_steps=None),
    )
    est.train(lambda: input_fn().repeat(5).batch(2), steps=10)
    return est, str(vocab)


def _new(tmp_path, warm, vocab, **params):
    return E.Estimator(
        model_fn,
        model_dir=str(tmp_path / "new"),
        params={"vocab": vocab, "seed": 2, "lr": 0.0, **params},
        config=E.RunConfig(log_step_count_steps=None),
        warm_start_from=warm,
    )


def test_a_regex_warm_starts_only_the_trainable_variables_it_matches(source, tmp_path):
    est, vocab = source
    new = _new(tmp_path, E.WarmStartSettings(est.model_dir, vars_to_warm_start="dense/"), vocab)
    new.train(lambda: input_fn().batch(2), steps=1)  # lr 0: the values stay as initialised
    np.testing.assert_array_equal(
        new.get_variable_value("dense/w"), est.get_variable_value("dense/w")
    )
    np.testing.assert_array_equal(new.get_variable_value("b"), [0.5])  # not chosen
    assert not np.allclose(new.get_variable_value(EMBEDDING), est.get_variable_value(EMBEDDING))


def test_a_path_warm_starts_every_trainable_variable(source, tmp_path):
    est, vocab = source
    new = _new(tmp_path, est.latest_checkpoint(), vocab)
    expected = [p["y"] for p in est.predict(lambda: input_fn().batch(2))]
    np.testing.assert_allclose(
        [p["y"] for p in new.predict(lambda: input_fn().batch(2))], expected, rtol=1e-6
    )


def test_vocab_info_remaps_rows_and_prev_names_rename(source, tmp_path):
    est, old_vocab = source
    new_vocab = tmp_path / "new_vocab.txt"
    new_vocab.write_text("cherry\napple\ndate\n")
    settings = E.WarmStartSettings(
        est.model_dir,
        vars_to_warm_start=".*",
        var_name_to_vocab_info={
            EMBEDDING: E.VocabInfo(
                new_vocab=str(new_vocab),
                new_vocab_size=3,
                num_oov_buckets=0,
                old_vocab=old_vocab,
                backup_initializer=tf.compat.v1.zeros_initializer(),
            )
        },
        var_name_to_prev_var_name={"renamed/w": "dense/w"},
    )
    new = _new(tmp_path, settings, str(new_vocab), scope="renamed")
    new.train(lambda: input_fn().batch(2), steps=1)
    old = est.get_variable_value(EMBEDDING)
    np.testing.assert_array_equal(new.get_variable_value(EMBEDDING), [old[2], old[0], [0.0, 0.0]])
    np.testing.assert_array_equal(
        new.get_variable_value("renamed/w"), est.get_variable_value("dense/w")
    )


def test_warm_start_settings_are_checked():
    with pytest.raises(ValueError, match="ckpt_to_initialize_from"):
        E.WarmStartSettings("")
    with pytest.raises(ValueError, match="warm_start_from"):
        E.Estimator(model_fn, warm_start_from=3)
    assert E.WarmStartSettings("/m").vars_to_warm_start == ".*"
