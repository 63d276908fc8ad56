r"""Lists what a run's --model_dir holds: tables, sizes, memory, versions, and which restore.

Examples:
  python3 run.py script inspect_checkpoint --model_dir=/tmp/run
  python3 run.py script inspect_checkpoint --model_dir=/tmp/run --json

Reads the checkpoint files only (no model is built). Each table's memory is
what it would hold restored from the latest restorable version
(`SparseTable.memory_stats` of a table of exactly that many rows: rows in their
stored dtype, slots, per-row metadata, key index); for a tiered table, whose
checkpoint records its `memory_rows`, the rows a restore keeps in memory (the
disk tier's own key index not counted) and those it writes to disk. Every
committed version
is checked as a restore checks it (its full save and the deltas up to it,
every part present with the size and SHA-256 its commit record names) and
marked restorable, or damaged with the file and the reason; versions moved
aside to retired/ and part files without a commit record are listed too.
`restore_model_version` lists the restorable versions. A damaged directory is
described, not an error (exit status 0).
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from npu_rec.scripts import _cli
from npu_rec.scripts import _flags as F

_checkpoints = _cli.lazy("npu_rec.scripts._checkpoints")
_report = _cli.lazy("npu_rec.scripts._report")

flags.declare_key_flag("model_dir")
_JSON = flags.DEFINE_bool("json", False, "Print the description as JSON.")


def run() -> dict:
    """Prints and returns the description of --model_dir."""
    model_dir = F.MODEL_DIR.value
    if not model_dir or not os.path.isdir(model_dir):
        raise app.UsageError(
            f"--model_dir must be an existing directory. Received: --model_dir={model_dir!r}"
        )
    info = _checkpoints.describe(model_dir)
    if _JSON.value:
        print(json.dumps(info, indent=2))
        return info
    print(f"model_dir: {model_dir}")
    print("tables:")
    for name, t in info["tables"].items():
        print(
            f"  {name}: dim={t.get('dim')} rows={t.get('rows', 0)} "
            f"value_dtype={t.get('value_dtype', 'float32')} "
            f"slots={','.join(t.get('slots', []))}"
        )
        if t.get("memory_rows"):
            print(
                f"    tiered: memory_rows={t['memory_rows']}; a restore keeps "
                f"{t.get('rows', 0) - t.get('disk_rows', 0)} rows in memory and writes "
                f"{t.get('disk_rows', 0)} to the disk tier"
            )
        if t.get("memory"):
            print(f"    restored in memory: {_report.memory_line(t['memory'])}")
    print("versions:")
    for v in info["versions"]:
        parent = "" if v["parent"] is None else f" (delta of {v['parent']})"
        status = v["status"]
        if status == "damaged":
            status += f": {v['problem']}"
        elif status == "retired":
            status += f" (in {v['where']})"
        elif status == "uncommitted":
            status += f": {', '.join(v['files'])}: {v['problem']}"
        print(
            f"  step {v['step']:>8} {v['kind'] or '-':5} {v['bytes']:>10} bytes{parent}  {status}"
        )
    for r in info["commit_records_unreadable"]:
        print(f"  commit record {r['record']}: {r['problem']}; the version it published is skipped")
    print(f"dense versions: {info['dense_versions']}")
    print(f"restore_model_version: {info['restore_model_version']}")
    return info


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    run()


if __name__ == "__main__":
    _cli.run(main, __doc__, own=("json",), groups=(("checkpoints", ("model_dir",)),))
