"""The README's examples are code users copy: they must run."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _examples():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_readme_has_examples():
    assert _examples()


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_example_runs(index, capsys):
    exec(compile(_examples()[index], f"README example {index}", "exec"), {})
    assert capsys.readouterr().out.strip()
