"""Table checkpoints: full and delta saves of sparse tables, verified restores."""

from npu_rec.checkpoint._file_format import CheckpointCorruptedError, read_file, write_file
from npu_rec.checkpoint._manager import CheckpointVersion, TableCheckpointManager

__all__ = [
    "CheckpointCorruptedError",
    "CheckpointVersion",
    "TableCheckpointManager",
    "read_file",
    "write_file",
]
