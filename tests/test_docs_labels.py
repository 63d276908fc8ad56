"""The tree describes the product, not how it was made: no development-history labels.

Docs, code, comments, tests, benchmark results and the README must not carry labels that
only meant something while the project was being built: the number of an issue or of a
working session, a bare "#12", commit hashes ("main at 9082ab1"), branch names ("branch `x`") or paths of one
machine ("/home/me/...", "/work/..."). Each place says what the behaviour is instead.

What may stay (docs/development.md, "Labels in the tree"): another project's issue cited as
`owner/repo#N` (keras-team/keras#20585) and another project's commit as `owner/repo@<hash>`;
hexadecimal data values in quotes ("05db9164", a hashed Criteo value); `/tmp/...` paths in
examples.
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = ("docs", "npu_rec", "tests", "benchmarks", "scripts")
FILES = ("README.md", "run.py", "setup.cfg", "pyproject.toml")
SUFFIXES = (".py", ".md", ".cc", ".h", ".sh", ".cfg", ".toml", ".json", ".yaml", ".yml")

LABELS = {
    "an issue or session number": re.compile(r"(?<![a-z])(issue|session)s?[ _-]?#?\d+", re.I),
    "a bare issue or pull-request number (cite another project as owner/repo#N)": re.compile(
        r"(?<![\w/&#])#\d+\b"
    ),
    "a commit hash (cite another project's as owner/repo@<hash>)": re.compile(
        r"(?<![\w@/.'\"-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w'\"-])"
    ),
    "a branch name": re.compile(r"\bbranch(es)?\s+`[^`]+`", re.I),
    "a path of one machine": re.compile(r"(?<![\w.])(/work/|/home/\w|/Users/\w|/root/)"),
}


def files() -> list[str]:
    """Every text file of the tree this test reads, relative to the checkout."""
    found = [f for f in FILES if os.path.exists(os.path.join(ROOT, f))]
    for tree in TREES:
        for folder, dirs, names in os.walk(os.path.join(ROOT, tree)):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            found += [
                os.path.relpath(os.path.join(folder, n), ROOT)
                for n in sorted(names)
                if n.endswith(SUFFIXES)
            ]
    return found


def labels(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the matched text) of every label in `text`."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in LABELS.items():
            out += [(number, what, m.group(0)) for m in pattern.finditer(line)]
    return out


def test_the_tree_carries_no_development_labels():
    assert len(files()) > 100, files()  # the walk found the tree
    this = os.path.relpath(__file__, ROOT)
    found = []
    for path in files():
        if path == this:  # its docstring and patterns name the labels
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            found += [f"{path}:{n}: {what}: {text!r}" for n, what, text in labels(f.read())]
    assert not found, "describe the behaviour instead of:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "The owned key map (" + "issue" + " 17).",  # spelled apart: the tree itself stays clean
        "as measured in " + "session" + " 9",
        "Session-1 figures",
        "def test_issue4_example():",
        "fixed in #23",
        "main at 9082ab1",
        "(code of `main` at dbef380)",
        "on branch `s10-groups` (not merged)",
        "written to /work/wt/x/out.json",
        "cd /home/alice/npu_rec",
    ],
)
def test_each_kind_of_label_is_found(text):
    assert labels(text), text


@pytest.mark.parametrize(
    "text",
    [
        "works around keras-team/keras#20585 for RecModel",
        "from `shenweichen/DeepCTR@1b5fe40e158d1ee6af8b1d9df217a5ed5aea9136`",
        'ids = hash_strings(["05db9164", "", "68fd1e64"])',
        "python3 run.py script train --model_dir=/tmp/wdl",
        "ckpt-000000000100.full.nrc",
        "a tf.compat.v1.Session, the session's hooks, MonitoredTrainingSession",
        "mixing constant 0x9e3779b97f4a7c15",
        "the else branch of the cond",
        "2147483647 and 1e-6 and deadbeef",
    ],
)
def test_legitimate_text_is_not_a_label(text):
    assert labels(text) == [], text
