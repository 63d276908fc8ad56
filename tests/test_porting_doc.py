"""docs/porting.md, "From tf.estimator": its example is the documented port; it must run."""

import os
import re

import npu_rec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _section():
    with open(os.path.join(ROOT, "docs", "porting.md")) as f:
        text = f.read()
    return text[text.index("## From tf.estimator") :]


def test_table_names_what_needs_a_change():
    rows = [r for r in _section().splitlines() if r.startswith("| `")]
    changes = [r for r in rows if r.endswith("| change |")]
    assert any("tf.layers" in r and "tf_keras" in r for r in changes)
    assert any("tf.contrib" in r for r in changes)
    assert any(r.endswith("| imports only |") and "export" in r for r in rows)


def test_from_tf_estimator_example_runs(capsys):
    (code,) = re.findall(r"```python\n(.*?)```", _section(), flags=re.S)
    npu_rec.shutdown()
    try:
        exec(compile(code, "docs/porting.md example", "exec"), {})
    finally:
        npu_rec.shutdown()
    out = capsys.readouterr().out
    step, accuracy = re.search(r"step (\d+) accuracy ([\d.]+)", out).groups()
    assert int(step) == 24 and 0.0 <= float(accuracy) <= 1.0
    assert "signatures ['predict', 'serving_default']" in out


#: tf.estimator 2.15's public names (its TensorFlow 2 API: `tf.estimator`,
#: `tf.estimator.experimental`, `tf.estimator.export`).
TF_ESTIMATOR_215 = {
    *(
        "BaselineClassifier BaselineEstimator BaselineRegressor BestExporter BinaryClassHead "
        "CheckpointSaverHook CheckpointSaverListener DNNClassifier DNNEstimator "
        "DNNLinearCombinedClassifier DNNLinearCombinedEstimator DNNLinearCombinedRegressor "
        "DNNRegressor Estimator EstimatorSpec EvalSpec Exporter FeedFnHook FinalExporter "
        "FinalOpsHook GlobalStepWaiterHook Head LatestExporter LinearClassifier LinearEstimator "
        "LinearRegressor LoggingTensorHook LogisticRegressionHead ModeKeys MultiClassHead "
        "MultiHead MultiLabelHead NanLossDuringTrainingError NanTensorHook PoissonRegressionHead "
        "ProfilerHook RegressionHead RunConfig SecondOrStepTimer SessionRunArgs "
        "SessionRunContext SessionRunHook SessionRunValues StepCounterHook StopAtStepHook "
        "SummarySaverHook TrainSpec VocabInfo WarmStartSettings add_metrics "
        "classifier_parse_example_spec regressor_parse_example_spec train_and_evaluate"
    ).split(),
    *(
        "experimental." + n
        for n in (
            "InMemoryEvaluatorHook LinearSDCA RNNClassifier RNNEstimator "
            "build_raw_supervised_input_receiver_fn call_logit_fn make_early_stopping_hook "
            "make_stop_at_checkpoint_step_hook stop_if_higher_hook stop_if_lower_hook "
            "stop_if_no_decrease_hook stop_if_no_increase_hook"
        ).split()
    ),
    *(
        "export." + n
        for n in (
            "ClassificationOutput EvalOutput ExportOutput PredictOutput RegressionOutput "
            "ServingInputReceiver TensorServingInputReceiver "
            "build_parsing_serving_input_receiver_fn build_raw_serving_input_receiver_fn"
        ).split()
    ),
}
#: The premade estimators and heads.
CANNED = {n for n in TF_ESTIMATOR_215 if re.search(r"(Classifier|Regressor|Estimator|Head)$", n)}
CANNED = (CANNED - {"Estimator"}) | {"experimental.LinearSDCA"}
#: Names only TRAIN / EVAL exports use (npu_rec exports the PREDICT graph a model_fn serves).
NOT_NEEDED_BY_A_MODEL_FN = {
    "export.EvalOutput",
    "experimental.build_raw_supervised_input_receiver_fn",
}


def _name_table():
    text = _section()
    table = text[text.index("## tf.estimator 2.15 names") :]
    rows = re.findall(r"^\| `tf\.estimator\.([\w.]+)` \| (.*) \| ([a-z ]+) \|$", table, re.M)
    return {name: (what, status) for name, what, status in rows}


def test_the_name_table_lists_every_tf_estimator_name_with_its_true_status():
    import importlib

    table = _name_table()
    assert set(table) == TF_ESTIMATOR_215
    for name, (what, status) in table.items():
        if status == "supported":
            module, _, attr = f"npu_rec.estimator.{name}".rpartition(".")
            assert f"`npu_rec.estimator.{name}`" in what
            assert hasattr(importlib.import_module(module), attr), name
        elif status == "canned":
            assert name in CANNED, name
        else:
            assert status == "not supported" and name in NOT_NEEDED_BY_A_MODEL_FN, name
    assert {n for n, (_, s) in table.items() if s == "canned"} == CANNED
