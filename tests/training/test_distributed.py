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


def test_nccls_watchdog_takes_a_timed_out_rank_down_within_ten_seconds_unless_the_user_said_otherwise(monkeypatch):
    import os

    from infcl_ds.training.distributed import NCCL_DUMP_WAIT_MS, NCCL_DUMP_WAITS, nccl_watchdog_env
    environ = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}  # the user's own choice stays
    monkeypatch.setattr(os, "environ", environ)  # nothing leaks into the other tests' process
    nccl_watchdog_env()
    assert environ == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                       "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": str(NCCL_DUMP_WAIT_MS),
                       "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN": "0"}
    assert NCCL_DUMP_WAITS * NCCL_DUMP_WAIT_MS == 10_000
