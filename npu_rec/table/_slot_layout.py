"""Restored optimizer slots fitted to the table's layout (one value per element or per row).

An optimizer keeps a slot either per element (`Adagrad`'s accumulator: float32
[n, dim]) or per row (`RowWiseAdagrad`'s, named in its `row_slots`: float32
[n, 1]). A state saved under one layout can meet a table of the other (a
checkpoint of an `Adagrad` table restored into a `RowWiseAdagrad` table, or the
reverse). `fit_slots` runs before anything is written into the table:

* an `accumulator` (the running sum of squared gradients of the Adagrad rules)
  is converted: per element -> per row takes the mean over the row's elements,
  which is exactly the row-wise accumulator of the same gradients (the
  row-wise rule adds the mean of the squared gradient; both start from
  `initial_accumulator_value`); per row -> per element gives every element the
  row's value (an estimate: the row's mean). Logged once per restore;
* any other slot whose saved shape does not fit, and a slot the state lacks,
  raise a `ValueError` naming the table, the slot, the saved and the expected
  shapes and the table's optimizer, before the table changes.
"""

from __future__ import annotations

import numpy as np

from npu_rec import _log as logging

#: The slots `fit_slots` converts between the layouts (a sum of squared gradients).
CONVERTIBLE = ("accumulator",)


def _layout(width: int, dim: int) -> str:
    if width == 1 and dim != 1:
        return "one value per row (a row-wise optimizer such as RowWiseAdagrad)"
    return "one value per element (an element-wise optimizer such as Adagrad)"


def fit_slots(
    table_name: str,
    state: dict,
    slot_dims: dict[str, int],
    dim: int,
    optimizer,
    rows: int | None = None,
    prefix: str = "slot/",
    what: str = "rows",
) -> dict:
    """`state` with each `<prefix><name>` slot of width `slot_dims[name]` (see module docstring).

    Args:
      table_name: For messages.
      state: A table state (`read_state`'s entries); not modified.
      slot_dims: Slot name -> its width in the table (`dim`, or 1 per row).
      dim: The table's row width.
      optimizer: The table's optimizer (named in the messages).
      rows: Rows the slots must have (None: the state's `keys`).
      prefix: Of the slot entries (`slot/`, or `fallback/slot/`).
      what: What the rows are, for messages ("rows", "fallback rows").

    Raises:
      ValueError: a slot is missing, or its saved shape fits the table neither
        as it is nor by the conversion above.
    """
    if rows is None:
        rows = int(np.asarray(state["keys"]).shape[0])
    out = dict(state)
    opt = type(optimizer).__name__ if optimizer is not None else None
    for name, width in slot_dims.items():
        key = f"{prefix}{name}"
        want = (rows, width)
        if key not in state:
            saved = sorted(k[len(prefix) :] for k in state if str(k).startswith(prefix))
            raise ValueError(
                f"Cannot restore sparse table {table_name!r}: its optimizer {opt} keeps the "
                f"slot {name!r} of its {what}, which the saved state lacks (saved slots: "
                f"{saved}: was it saved with another optimizer?). Restore it into a table "
                "with the saved optimizer."
            )
        value = np.asarray(state[key], np.float32)
        if value.shape == want:
            continue
        saved_width = value.shape[1] if value.ndim == 2 and value.shape[0] == rows else None
        if name in CONVERTIBLE and {saved_width, width} == {1, dim}:
            if width == 1:
                out[key] = value.mean(axis=1, keepdims=True)
                how = "the mean of each row's elements"
            else:
                out[key] = np.repeat(value, dim, axis=1)
                how = "each row's value in every element"
            logging.info(
                "npu_rec: table %r restores slot %r of %d %s saved with %s into %s of %s "
                "(converted: %s).",
                table_name,
                name,
                rows,
                what,
                _layout(saved_width, dim),
                opt,
                _layout(width, dim),
                how,
            )
            continue
        raise ValueError(
            f"Cannot restore sparse table {table_name!r}: slot {name!r} of its {what} was "
            f"saved with shape {tuple(value.shape)}, but the table's optimizer {opt} keeps "
            f"it with shape {want} ({_layout(width, dim)}); the checkpoint was written with "
            "another optimizer or layout. Restore it into a table with the saved optimizer."
        )
    return out
