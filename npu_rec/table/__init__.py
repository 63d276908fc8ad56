"""The sparse-table core: tables, their state and checkpoint arrays, lookups and gradients."""
