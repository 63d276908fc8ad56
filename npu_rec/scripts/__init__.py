"""absl-flag scripts over the reference models: `python -m npu_rec.scripts.NAME` or the
console commands `npu-rec-NAME` (docs/scripts.md). They need the `scripts` extra
(`pip install 'npu-rec[scripts]'`); without it this import fails naming it."""

from npu_rec._console import require_scripts_extra

require_scripts_extra()
