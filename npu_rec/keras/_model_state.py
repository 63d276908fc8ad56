"""What a `RecModel` saves and restores beyond Keras: tables and the global step.

`ModelStateMixin` gives `RecModel`:

* `get_weights` / `set_weights` that carry a snapshot of the tables, so
  callbacks that restore weights (`EarlyStopping(restore_best_weights=True)`)
  restore a whole model rather than mixing epochs;
* the global step among the model's own variables in `.keras` and
  `.weights.h5` files (`ModelCheckpoint`, `BackupAndRestore`);
* `save` / `save_weights` that refuse a non-finite dense state.
"""

from __future__ import annotations

import numpy as np

from npu_rec import _log as logging
from npu_rec.keras import _finite

#: The global step's entry among the model's own variables in `.keras` / `.weights.h5` files.
STEP_KEY = "npu_rec_global_step"


class ModelStateMixin:
    """The state methods of `RecModel` (see the module docstring).

    Expects `tables`, `global_step` and `_global_step` from the model, and a
    `table_state_loads` counter it increments whenever tables are replaced.
    """

    # ------------------------------------------------------------------ weights
    def get_weights(self) -> list:
        """The dense weights as NumPy arrays, with a snapshot of every table.

        Returns:
          A list of the values of `model.weights` (as `keras.Model.get_weights`)
          whose attribute `tables` maps each table name to a copy of that
          table's whole state (rows, optimizer slots, counts, last-seen times,
          not-yet-admitted keys). The copy costs host memory the size of the
          tables' live rows.
        """
        weights = _WeightsWithTables(super().get_weights())
        weights.tables = {t.name: t.read_state(0) for t in self.tables}
        return weights

    def set_weights(self, weights) -> None:
        """Sets the dense weights and, given `get_weights()`'s list, the tables too.

        With the list `get_weights()` returned, the model's tables go back to
        the snapshot exactly, so callbacks such as `EarlyStopping(
        restore_best_weights=True)` restore a whole model. With a plain list of
        arrays only `model.weights` are set and the tables keep their state
        (logged once per model).

        Raises:
          ValueError: the list length or a shape does not match `model.weights`,
            or the snapshot lacks a table of this model or holds another layout.
        """
        tables = getattr(weights, "tables", None)
        if tables is not None:
            self._check_table_snapshot(tables)
        super().set_weights(list(weights))
        if tables is None:
            if self.tables and not getattr(self, "_warned_dense_only", False):
                self._warned_dense_only = True
                logging.warning(
                    "npu_rec: RecModel.set_weights got a plain list of dense weights: the "
                    "sparse tables %s keep their current state. Pass the list returned by "
                    "model.get_weights() to restore them too.",
                    [t.name for t in self.tables],
                )
            return
        self.table_state_loads += 1
        for table in self.tables:
            table.write_state(tables[table.name])

    def _check_table_snapshot(self, tables: dict) -> None:
        missing = sorted(t.name for t in self.tables if t.name not in tables)
        if missing:
            raise ValueError(
                f"set_weights: the weights hold no snapshot of tables {missing} of "
                f"this model; they hold {sorted(tables)}. Pass a list returned by "
                f"this model's get_weights(), or a plain list to set dense weights "
                f"only."
            )
        for table in self.tables:
            state = tables[table.name]
            slots = sorted(k[len("slot/") :] for k in state if k.startswith("slot/"))
            if state["values"].shape[1:] != (table.dim,) or slots != sorted(table.slot_names):
                raise ValueError(
                    f"set_weights: the snapshot of table {table.name!r} has dim="
                    f"{state['values'].shape[1:]} and slots={slots}, but the table has dim="
                    f"{table.dim} and slots={sorted(table.slot_names)}."
                )

    # ------------------------------------------------------------------ saving
    def save(self, filepath, overwrite=True, zipped=None, **kwargs):
        """`keras.Model.save`, refused while a dense weight is NaN or infinite.

        Raises:
          ValueError: a weight or optimizer variable holds a non-finite value.
        """
        _finite.check_finite_state(self, "model.save")
        return super().save(filepath, overwrite=overwrite, zipped=zipped, **kwargs)

    def save_weights(self, filepath, overwrite=True, max_shard_size=None):
        """`keras.Model.save_weights` (tables and global step included), refused while a
        dense weight is NaN or infinite (so `BackupAndRestore` never backs such a state up).

        Raises:
          ValueError: a weight or optimizer variable holds a non-finite value.
        """
        _finite.check_finite_state(self, "model.save_weights")
        return super().save_weights(filepath, overwrite=overwrite, max_shard_size=max_shard_size)

    def save_own_variables(self, store):
        """Saves the model's own variables and its global step (`.keras`, `.weights.h5`)."""
        super().save_own_variables(store)
        store[STEP_KEY] = np.asarray(self.global_step, np.int64)

    def load_own_variables(self, store):
        """Loads what `save_own_variables` saved; a file without a global step keeps it."""
        self.table_state_loads += 1  # the layers load their tables in the same call
        keys = list(store.keys())
        if STEP_KEY in keys:
            self._global_step.assign(int(np.asarray(store[STEP_KEY])))
            store = _Without(store, STEP_KEY)
        super().load_own_variables(store)


class _WeightsWithTables(list):
    """`RecModel.get_weights()`: the dense arrays, plus `tables` (name -> table state)."""

    tables: dict


class _Without:
    """A read-only view of a Keras weights store without one key."""

    def __init__(self, store, key: str):
        self._store, self._key = store, key

    def keys(self):
        return [k for k in self._store.keys() if k != self._key]

    def __getitem__(self, key):
        return self._store[key]

    def __len__(self):
        return len(self.keys())
