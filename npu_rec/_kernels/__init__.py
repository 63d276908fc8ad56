"""Compiled table kernels (C++ TensorFlow ops) and their stock-op fallback.

`_build` compiles the shipped sources on first use and caches the library;
`_ops` wraps the ops for the table code. See docs/design.md, "Compiled kernels".
"""
