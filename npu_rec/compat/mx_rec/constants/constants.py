"""mx_rec's constants: graph collection names and enums."""

from __future__ import annotations

import enum

#: Collection of per-example timestamp tensors (admission and eviction times).
ASCEND_TIMESTAMP = "ASCEND_TIMESTAMP"
#: Collection of each training lookup's unique-row tensor (differentiate the loss by it).
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
#: Collection of each training lookup's rows (the "addresses" of by-address optimizers).
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
#: Collection of each training lookup's unique keys.
ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
#: Name of mx_rec's host pipeline op library; `import_host_pipeline_ops` accepts and ignores it.
LIBREC_CPU_SO = "librec_cpu.so"
#: Name of mx_rec's end-of-sequence op library (`Dataset.eos_map`'s first argument); unused.
LIBREC_EOS_OPS_SO = "libasc_ops.so"


class BaseEnum(enum.Enum):
    """An enum whose `mapping(value)` returns the member of that value."""

    @classmethod
    def mapping(cls, key):
        for member in cls:
            if member.value == key:
                return member
        raise ValueError(
            f"{cls.__name__}: the value must be one of {[m.value for m in cls]}. Received: {key!r}"
        )


class ApplyGradientsStrategy(BaseEnum):
    """How gradients of repeated ids are applied (npu_rec always sums them first)."""

    DIRECT_APPLY = "direct_apply"
    SUM_SAME_ID_GRADIENTS_AND_APPLY = "sum_same_id_gradients_and_apply"


class All2allGradientsOp(BaseEnum):
    """Gradient reduction over ranks (one process on npu_rec: both are the same)."""

    SUM_GRADIENTS = "sum_gradients"
    SUM_GRADIENTS_AND_DIV_BY_RANKSIZE = "sum_gradients_and_div_by_ranksize"
