"""docs/benchmarks.md stays a short reference, and every benchmark script is documented."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 300


def test_benchmarks_reference_stays_short():
    with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"docs/benchmarks.md has {len(lines)} lines; a reference of at most {MAX_LINES}: "
        "replace figures, condense, keep history in git"
    )


def test_every_benchmark_script_is_described_in_the_docs():
    docs = os.path.join(ROOT, "docs")
    text = ""
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            with open(os.path.join(docs, name), encoding="utf-8") as f:
                text += f.read()
    helpers = {"torchrec_worker", "kafka_mock_broker"}  # run by the scripts, not by users
    scripts = sorted(
        n[:-3]
        for n in os.listdir(os.path.join(ROOT, "benchmarks"))
        if n.endswith(".py") and not n.startswith("_") and n[:-3] not in helpers
    )
    missing = [n for n in scripts if n not in text]
    assert missing == [], f"benchmark scripts no page of docs/ describes: {missing}"


def test_results_hold_one_json_per_benchmark_script():
    results = os.path.join(ROOT, "benchmarks", "results")
    scripts = {n[:-3] for n in os.listdir(os.path.join(ROOT, "benchmarks")) if n.endswith(".py")}
    strays = sorted(
        n for n in os.listdir(results) if not (n.endswith(".json") and n[:-5] in scripts)
    )
    assert strays == [], f"benchmarks/results keeps one NAME.json per benchmarks/NAME.py: {strays}"
