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
