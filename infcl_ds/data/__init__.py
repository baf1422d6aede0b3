"""The data layer: `build_train_data` (one rank's resumable stream of batches for the trainer)
and `build_eval_data` (a labelled split with zero-shot prompts for evaluation)."""
from .decoding.batch import HostBatch
from .errors import DataError
from .eval_split import build_eval_data
from .train_stream import build_train_data

__all__ = ["build_train_data", "build_eval_data", "HostBatch", "DataError"]
