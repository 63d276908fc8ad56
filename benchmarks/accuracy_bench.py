"""Eval AUC of a DLRM-style model under table settings: what a table option costs or gains.

Each run trains the reference DLRM (`npu_rec.models.build_rec_model("dlrm")`:
embedding dim 16, bottom MLP 13-64-16, dot interaction, top MLP 256-128-1,
Adam on the dense part, the chosen sparse optimizer on the table) with
`RecModel.fit` for a fixed number of steps, then computes the exact ROC AUC
of its predictions on held-out rows. One table serves all 26 categorical
features (keys salted per feature), with admission at `--access_threshold`.

Data (`--data`, comma-separated):

  synthetic      `npu_rec.data.SyntheticCriteo(seed=<run seed>)`: Criteo-shaped
                 rows with a planted signal; trains on the first
                 `--steps * --batch_size` rows (one pass), evaluates on the
                 next `--eval_rows`. Power-law ids: most ids are rare, so
                 admission at 3 sightings leaves many of them without a row.
  criteo_sample  the shipped 200-row Criteo sample (`npu_rec/data/samples`):
                 the first 160 rows train (`--sample_steps` steps of
                 `--sample_batch`, cycling), the last 40 evaluate. Tiny: its
                 AUC is noisy, a smoke check of real hashed ids only.

Every combination of the table flags (`--not_admitted`, `--value_dtype`,
`--sparse_optimizer`, each a comma-separated list) runs once per data set
and seed (`--seeds`); runs of one seed see the same data and the same dense
initialisation, so their AUC differences are paired. Values a build of
npu_rec does not know (a `value_dtype` or optimizer it lacks) fail that run,
reported in the table. Prints a table (AUC per seed, mean, and the paired
difference from the first combination) and writes JSON.

Example (the docs/benchmarks.md run):
  python benchmarks/accuracy_bench.py --not_admitted=zeros,hashed --access_threshold=3
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags
from absl import logging as absl_logging

import npu_rec
from npu_rec.data import CATEGORICAL_NAMES, DENSE_NAMES, SyntheticCriteo
from npu_rec.data._samples import load_sample
from npu_rec.models import build_rec_model, specs_for

_DATA = flags.DEFINE_list("data", ["synthetic", "criteo_sample"], "Data sets to run.")
_SEEDS = flags.DEFINE_list("seeds", ["1", "2", "3"], "Seeds (data set and dense init).")
_NOT_ADMITTED = flags.DEFINE_list(
    "not_admitted", ["zeros", "hashed"], "create_table(not_admitted=...) values to compare."
)
_VALUE_DTYPE = flags.DEFINE_list(
    "value_dtype", [], "create_table(value_dtype=...) values to compare (empty: not passed)."
)
_SPARSE_OPT = flags.DEFINE_list(
    "sparse_optimizer",
    ["adagrad"],
    "Table optimizers to compare: adagrad, rowwise_adagrad, sgd, adam, ftrl.",
)
_INIT = flags.DEFINE_string(
    "initializer",
    None,
    "create_table(initializer=...) of the table, a Keras initializer name (default: the "
    "keyed uniform(-0.05, 0.05)).",
)
_ACCESS = flags.DEFINE_integer(
    "access_threshold", 3, "Admission threshold of the table (-1 off).", lower_bound=-1
)
_BUCKETS = flags.DEFINE_integer(
    "fallback_buckets", 1 << 20, "Fallback rows with not_admitted=hashed.", lower_bound=1
)
_STEPS = flags.DEFINE_integer("steps", 300, "Training steps (synthetic).", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 1024, "Batch size (synthetic).", lower_bound=1)
_EVAL_ROWS = flags.DEFINE_integer("eval_rows", 32768, "Held-out rows (synthetic).", lower_bound=1)
_SAMPLE_STEPS = flags.DEFINE_integer(
    "sample_steps", 40, "Training steps (criteo_sample).", lower_bound=1
)
_SAMPLE_BATCH = flags.DEFINE_integer("sample_batch", 32, "Batch size (criteo_sample).")
_SPARSE_LR = flags.DEFINE_float("sparse_learning_rate", 0.05, "Table learning rate.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Dense Adam learning rate.")
_OUT = flags.DEFINE_string(
    "out",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "accuracy_bench.json"),
    "JSON output path.",
)

_OPTIMIZERS = {
    "adagrad": "Adagrad",
    "rowwise_adagrad": "RowWiseAdagrad",
    "sgd": "SGD",
    "adam": "Adam",
    "ftrl": "Ftrl",
}


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney U, ties counted half)."""
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    for end in range(1, len(scores) + 1):  # average ranks over ties
        if end == len(scores) or sorted_scores[end] != sorted_scores[start]:
            ranks[order[start:end]] = (start + end + 1) / 2.0
            start = end
    pos, neg = labels.sum(), (~labels).sum()
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def _features(rows: dict) -> dict:
    out = {n: np.log1p(np.maximum(rows[n], 0)).astype(np.float32) for n in DENSE_NAMES}
    out.update({n: np.asarray(rows[n], np.int64) for n in CATEGORICAL_NAMES})
    return out


def load(data: str, seed: int):
    """(train features, train labels, eval features, eval labels, batch size, steps)."""
    if data == "synthetic":
        n = _STEPS.value * _BATCH.value
        rows = SyntheticCriteo(seed=seed).rows(0, n + _EVAL_ROWS.value)
        x = _features(rows)
        y = rows["label"].astype(np.float32)
        split = {k: (v[:n], v[n:]) for k, v in x.items()}
        return (
            {k: v[0] for k, v in split.items()},
            y[:n],
            {k: v[1] for k, v in split.items()},
            y[n:],
            _BATCH.value,
            _STEPS.value,
        )
    if data == "criteo_sample":
        rows = load_sample("criteo_sample")
        dense = {n: np.nan_to_num(np.asarray(rows[n], np.float32)) for n in DENSE_NAMES}
        x = _features({**rows, **dense})
        y = np.asarray(rows["label"], np.float32)
        train = {k: v[:160] for k, v in x.items()}
        batch = _SAMPLE_BATCH.value
        reps = -(-_SAMPLE_STEPS.value * batch // 160)
        rng = np.random.default_rng(seed)
        order = np.concatenate([rng.permutation(160) for _ in range(reps)])
        order = order[: _SAMPLE_STEPS.value * batch]
        return (
            {k: v[order] for k, v in train.items()},
            y[:160][order],
            {k: v[160:] for k, v in x.items()},
            y[160:],
            batch,
            _SAMPLE_STEPS.value,
        )
    raise app.UsageError(f"--data must name synthetic or criteo_sample. Received: {data!r}")


def table_options(not_admitted: str, value_dtype: str | None) -> dict:
    """`create_table` arguments of one combination (only those given are passed)."""
    options = {"not_admitted": not_admitted, "dynamic_expansion": True}
    if not_admitted == "hashed":
        options["fallback_buckets"] = _BUCKETS.value
    if value_dtype is not None:
        options["value_dtype"] = value_dtype
    if _INIT.value is not None:
        options["initializer"] = _INIT.value
    return options


def run_one(data, seed, combo, loaded) -> dict:
    not_admitted, value_dtype, opt_name = combo
    x, y, ex, ey, batch, steps = loaded
    npu_rec.shutdown()
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    cls = getattr(npu_rec.optimizers, _OPTIMIZERS.get(opt_name, opt_name), None)
    if cls is None:
        raise ValueError(f"npu_rec.optimizers has no {opt_name!r} optimizer")
    lr = _SPARSE_LR.value
    threshold = None if _ACCESS.value < 0 else _ACCESS.value
    model = build_rec_model(
        "dlrm",
        specs_for(CATEGORICAL_NAMES, table_name="categorical", access_threshold=threshold),
        DENSE_NAMES,
        embedding_dim=16,
        sparse_optimizer=lambda: cls(lr),
        seed=seed,
        table_options=table_options(not_admitted, value_dtype),
    )
    model.compile(optimizer=keras.optimizers.Adam(_LR.value), loss="binary_crossentropy")
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    seconds = time.perf_counter() - start
    scores = model.predict(ex, batch_size=4096, verbose=0)
    table = model.tables[0]
    return {
        "data": data,
        "seed": seed,
        "not_admitted": not_admitted,
        "value_dtype": value_dtype,
        "sparse_optimizer": opt_name,
        "steps": steps,
        "batch_size": batch,
        "eval_rows": len(ey),
        "eval_auc": auc(ey, scores),
        "live_keys": int(table.size()),
        "train_seconds": round(seconds, 2),
    }


def _name(combo) -> str:
    not_admitted, value_dtype, opt = combo
    return "/".join(p for p in (not_admitted, value_dtype, opt) if p)


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)  # not the per-run init notes
    seeds = [int(s) for s in _SEEDS.value]
    combos = list(
        itertools.product(_NOT_ADMITTED.value, _VALUE_DTYPE.value or [None], _SPARSE_OPT.value)
    )
    runs = []
    for data in _DATA.value:
        for seed in seeds:
            loaded = load(data, seed)
            for combo in combos:
                try:
                    result = run_one(data, seed, combo, loaded)
                except (ValueError, TypeError) as err:  # an option this build lacks
                    result = {"data": data, "seed": seed, "combo": _name(combo), "error": str(err)}
                    print(f"{data} seed={seed} {_name(combo)}: failed: {err}", flush=True)
                else:
                    print(
                        f"{data} seed={seed} {_name(combo)}: auc={result['eval_auc']:.4f} "
                        f"({result['train_seconds']:.0f} s)",
                        flush=True,
                    )
                result["combo"] = _name(combo)
                runs.append(result)
    summary = {}
    base = _name(combos[0])
    header = f"{'data':<14} {'table settings':<28} " + " ".join(
        f"{'seed ' + str(s):>9}" for s in seeds
    )
    print()
    print(header + f" {'mean':>9} {'vs ' + base:>22}")
    for data in _DATA.value:
        by = {
            (r["combo"], r["seed"]): r.get("eval_auc")
            for r in runs
            if r["data"] == data and "error" not in r
        }
        for combo in combos:
            name = _name(combo)
            aucs = [by.get((name, s)) for s in seeds]
            cells = " ".join(f"{a:>9.4f}" if a is not None else f"{'failed':>9}" for a in aucs)
            got = [a for a in aucs if a is not None]
            mean = statistics.mean(got) if got else None
            gaps = [
                by[(name, s)] - by[(base, s)] for s in seeds if (name, s) in by and (base, s) in by
            ]
            gap = statistics.mean(gaps) if gaps and name != base else None
            summary[f"{data}:{name}"] = {
                "auc": aucs,
                "mean_auc": mean,
                "gap_vs_" + base: gaps if name != base else None,
                "mean_gap": gap,
                "gap_positive_seeds": sum(g > 0 for g in gaps) if name != base else None,
            }
            gap_text = (
                f"{gap:+.4f} ({sum(g > 0 for g in gaps)}/{len(gaps)} seeds > 0)"
                if gap is not None
                else "-"
            )
            mean_text = f"{mean:>9.4f}" if mean is not None else f"{'-':>9}"
            print(f"{data:<14} {name:<28} {cells} {mean_text} {gap_text:>22}")
    out = {
        "summary": summary,
        "runs": runs,
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
        },
        "flags": {
            f: flags.FLAGS[f].value
            for f in (
                "data",
                "seeds",
                "not_admitted",
                "value_dtype",
                "sparse_optimizer",
                "access_threshold",
                "fallback_buckets",
                "initializer",
                "steps",
                "batch_size",
                "eval_rows",
                "sample_steps",
                "sample_batch",
                "sparse_learning_rate",
                "learning_rate",
            )
        },
    }
    os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
    with open(_OUT.value, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    app.run(main)
