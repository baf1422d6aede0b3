"""infcl_ds/training/distributed.py: the joined group's timeout, and no deprecation warnings of torch on every rank."""
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from infcl_ds.training.distributed import _set_default_group_timeout, ignore_deepspeeds_deprecated_calls


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


def test_deepspeeds_deprecated_all_gather_is_not_shown(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ignore_deepspeeds_deprecated_calls()
            gathered = torch.zeros(3)
            dist.all_gather_into_tensor(gathered, torch.ones(3))
            warnings.warn("another FutureWarning still shows", FutureWarning)
        assert [str(w.message) for w in caught] == ["another FutureWarning still shows"]
        assert torch.equal(gathered, torch.ones(3))
    finally:
        dist.destroy_process_group()
