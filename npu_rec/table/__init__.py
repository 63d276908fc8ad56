"""The sparse-table core: tables, their state and checkpoint arrays, lookups and gradients.

Everything here is private; the public names (`create_table`, `SparseTable`,
`SingleShardTable`, `ShardedTable`, `TableConfig`, `sparse_lookup`, ...) are
exported by `npu_rec`. The map of the modules is at the top of docs/design.md.
"""
