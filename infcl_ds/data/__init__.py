"""The data layer: image-text batches for the trainer, and labelled data for evaluation.

- `build_train_data(spec, rank=, world_size=, local_batch=, seed=, image_size=, tokenizer=)`:
  one rank's resumable stream of `HostBatch`es over WebDataset shards, a CSV or synthetic data;
  a global permutation per (seed, epoch) cut into global batches, so every sample is seen once
  per epoch across ranks and every rank has the same number of steps.
- `build_eval_data(path, image_size=, tokenizer=)`: a labelled split with zero-shot prompts.
- `digits`: builds such splits from scikit-learn's bundled handwritten digits.

Module map: samples (decoding, skip rules) <- webdataset_source/tar_index, csv_source,
synthetic <- sources (spec dispatch); transforms (open_clip's, to uint8); sampler (who takes
what); dataset (replacement of unusable samples, collate); batch (HostBatch, normalisation);
train / eval (the two entry points).
"""
from .batch import HostBatch
from .errors import DataError
from .eval import build_eval_data
from .train import build_train_data

__all__ = ["build_train_data", "build_eval_data", "HostBatch", "DataError"]
