"""infcl_ds/training/distributed.py: setting the joined group's timeout."""
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from infcl_ds.training.distributed import _set_default_group_timeout


def test_default_group_timeout_set_without_a_deprecation_warning(tmp_path):
    # torch's private _set_pg_timeout warns (FutureWarning) on every rank of every run.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _set_default_group_timeout(timedelta(seconds=77))
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout == timedelta(seconds=77)
    finally:
        dist.destroy_process_group()
