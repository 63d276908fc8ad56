"""`python -m npu_rec.compat.run PROGRAM.py [ARGS]`: run an mx_rec/npu_bridge program as written.

In this process only, `mx_rec` and `npu_bridge` (and every module below them)
are importable as aliases of `npu_rec.compat.mx_rec` and
`npu_rec.compat.npu_bridge`; nothing is installed. The program runs as
`__main__` with `sys.argv = [PROGRAM.py, *ARGS]` and its directory first on
`sys.path`, as `python PROGRAM.py ARGS` would run it. `tf.compat.v1` gets the
few `tf.contrib` names TF 1.15 model code uses (`npu_rec.compat._tf_contrib`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import runpy
import sys

#: Top-level name -> the compat package it aliases.
ALIASES = {"mx_rec": "npu_rec.compat.mx_rec", "npu_bridge": "npu_rec.compat.npu_bridge"}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # imported already (create_module)


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds `mx_rec[.x]` / `npu_bridge[.x]` as the compat module of the same path."""

    def find_spec(self, fullname, path=None, target=None):
        top, _, rest = fullname.partition(".")
        if top not in ALIASES:
            return None
        real = ALIASES[top] + (f".{rest}" if rest else "")
        if importlib.util.find_spec(real) is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, _AliasLoader(real))
        real_spec = importlib.util.find_spec(real)
        if real_spec.submodule_search_locations is not None:
            spec.submodule_search_locations = list(real_spec.submodule_search_locations)
        return spec


def install() -> None:
    """Makes `mx_rec` and `npu_bridge` importable in this process (idempotent)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    program = argv[0]
    import os

    if not os.path.isfile(program):
        print(f"npu_rec.compat.run: error: no such program: {program}", file=sys.stderr)
        return 2
    install()
    from npu_rec.compat import _tf_contrib

    _tf_contrib.install()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    runpy.run_path(program, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
