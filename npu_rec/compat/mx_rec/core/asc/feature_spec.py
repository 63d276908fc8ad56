"""mx_rec's `FeatureSpec`: npu_rec's, plus mx_rec's `faae_coefficient`."""

from __future__ import annotations

import dataclasses

from npu_rec._validation import check_int
from npu_rec.data import FeatureSpec as _CoreFeatureSpec


@dataclasses.dataclass(frozen=True)
class FeatureSpec(_CoreFeatureSpec):
    """`npu_rec.data.FeatureSpec` with mx_rec's extra field.

    Args (beyond npu_rec's): faae_coefficient: mx_rec's admission weight of
      this feature's sightings (an int >= 1). npu_rec counts every sighting
      once, so a spec with admission (`access_threshold`) and a coefficient
      other than 1 is refused by `sparse_lookup`. `is_timestamp=None` means False.
    """

    faae_coefficient: int = 1

    def __post_init__(self):
        if self.is_timestamp is None:
            object.__setattr__(self, "is_timestamp", False)
        object.__setattr__(
            self,
            "faae_coefficient",
            check_int("faae_coefficient", self.faae_coefficient, 1, None),
        )
        super().__post_init__()
