"""Rec SDK (`mx_rec`) and `npu_bridge` programs on npu_rec, as written.

* `npu_rec.compat.mx_rec`: mx_rec's module tree (the same paths under this
  prefix) with mx_rec's signatures, as thin mappings over npu_rec's core.
* `npu_rec.compat.npu_bridge`: the npu_bridge paths Rec SDK programs use.
* `python -m npu_rec.compat.run PROGRAM.py [ARGS]`: runs an unchanged program
  with `mx_rec` and `npu_bridge` importable as aliases of these packages in
  that process only.

What each name means on a CPU is listed in docs/porting.md.
"""
