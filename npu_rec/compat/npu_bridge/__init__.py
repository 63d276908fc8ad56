"""The `npu_bridge` paths Rec SDK programs use, on npu_rec (see docs/porting.md)."""
