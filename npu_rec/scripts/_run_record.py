"""The flags that shape a run's model, recorded in its --model_dir.

Training writes `run_flags.json` into a new --model_dir: the front end, the
model, the embedding width, the table layout and sparse optimizer, the
admission/eviction thresholds, what not-yet-admitted ids read (--not_admitted,
--fallback_buckets), the rows' storage dtype and the data flags with the column roles
they resolve to. Every
later script on that --model_dir (evaluate, export, a resumed train) takes
those values for flags left at their defaults, and refuses an explicit value
that would build a different graph, in one line naming both values: a
checkpoint restored into another graph fails deep inside TensorFlow.

A different --data is accepted when its columns (label, dense, categorical)
are those of the run: it is other data for the same model.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

FILE = "run_flags.json"
#: Flags whose value changes the graph: an explicit different value is refused.
GRAPH = ("frontend", "model", "embedding_dim", "table_per_feature", "sparse_optimizer")
#: Flags that default to the recorded value (GRAPH, thresholds, row dtype, data and its
#: columns). A different --value_dtype is accepted: checkpoints restore across row dtypes.
DEFAULTED = (
    *GRAPH,
    "value_dtype",
    "access_threshold",
    "eviction_threshold",
    "not_admitted",
    "fallback_buckets",
    "data",
    "format",
    "label",
    "dense_features",
    "categorical_features",
)


def path(model_dir: str) -> str:
    return os.path.join(model_dir, FILE)


def read(model_dir: str) -> dict | None:
    """The record of --model_dir, or None when it has none (a new or an older run)."""
    if not model_dir or not os.path.exists(path(model_dir)):
        return None
    with open(path(model_dir)) as f:
        return json.load(f)


def write(model_dir: str, settings, plan) -> None:
    """Records the run's model flags (`settings`: `RunSettings`, `plan`: `DataPlan`)."""
    record = {name: getattr(settings, name) for name in GRAPH}
    record.update(
        access_threshold=settings.access_threshold,
        eviction_threshold=settings.eviction_threshold,
        value_dtype=settings.value_dtype,
    )
    record.update(not_admitted=settings.not_admitted, fallback_buckets=settings.fallback_buckets)
    record.update(
        {
            name: flags.FLAGS[name].value
            for name in ("data", "format", "label", "dense_features", "categorical_features")
        }
    )
    record["columns"] = _columns(plan)
    os.makedirs(model_dir, exist_ok=True)
    tmp = path(model_dir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, path(model_dir))


def _columns(plan) -> dict:
    return {"label": plan.label, "dense": list(plan.dense), "categorical": list(plan.categorical)}


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def apply(model_dir: str) -> dict | None:
    """Sets flags left at their defaults to the record of `model_dir`.

    Raises:
      app.UsageError: an explicit flag of `GRAPH` differs from the record.
    """
    record = read(model_dir)
    if record is None:
        return None
    for name in DEFAULTED:
        if name not in record:
            continue
        flag = flags.FLAGS[name]
        if flag.using_default_value:
            flag.value = record[name]
        elif name in GRAPH and flag.value != record[name]:
            raise app.UsageError(
                f"--{name}={_show(flag.value)} conflicts with --{name}={_show(record[name])} "
                f"of the training run in --model_dir={model_dir} ({FILE}): leave --{name} out "
                "to use the run's value, or give another --model_dir."
            )
    return record


def check_columns(model_dir: str, record: dict | None, plan) -> None:
    """Refuses data whose columns differ from those the run of `model_dir` trained on."""
    if record is None or "columns" not in record or _columns(plan) == record["columns"]:
        return
    want, got = record["columns"], _columns(plan)
    diff = next(k for k in ("label", "dense", "categorical") if want[k] != got[k])
    raise app.UsageError(
        f"--data={plan.name} has {diff} columns {_show(got[diff]) or '-'} but the training "
        f"run in --model_dir={model_dir} used {_show(want[diff]) or '-'} (--data="
        f"{record.get('data')}): give data with the run's columns, or another --model_dir."
    )
