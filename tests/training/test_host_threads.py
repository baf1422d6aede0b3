"""The training process's intra-op threads on a GPU rank (training/host_threads.py): what the
plan leaves it of the rank's cores, never less than one; left alone on CPU ranks, where
OMP_NUM_THREADS is set, or with the optimizer offloaded to the host."""
import torch

from infcl_ds.config import Recipe, load_recipe
from infcl_ds.plan.auto_values import recipe_with
from infcl_ds.plan.machine import split_cores
from infcl_ds.training import host_threads
from infcl_ds.training.host_threads import limit_host_threads, planned_threads

SHARE = split_cores(64, 4)  # 16 cores a rank


def recipe(**data) -> Recipe:
    return recipe_with(load_recipe(None, ["data.source=webdataset", "data.train=x"]), "data", **data)


def test_the_pool_gets_the_cores_the_decode_processes_and_readers_leave():
    assert planned_threads(recipe(decode_workers=14, workers=4), SHARE)[0] == 1
    assert planned_threads(recipe(decode_workers=4, workers=4), SHARE)[0] == 11
    assert planned_threads(recipe(decode_workers=14, workers=0), SHARE)[0] == 2
    assert planned_threads(recipe(decode_workers=10, workers=4, decoder="hybrid"), SHARE)[0] == 4
    count, why = planned_threads(recipe(decode_workers=40, workers=4), SHARE)
    assert count == 1 and why.endswith("less 40 decode processes and 4 readers (one core)")


def test_only_a_gpu_rank_without_omp_num_threads_or_a_host_optimizer_is_limited(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    planned = recipe(decode_workers=14, workers=4)
    assert limit_host_threads(planned, 4, torch.device("cpu"), SHARE, 0) is None
    assert limit_host_threads(planned, 4, torch.device("cuda", 0), SHARE, 1) == 1 and calls == [1]
    monkeypatch.setattr(host_threads, "offloads_optimizer", lambda recipe, world: True)
    assert limit_host_threads(planned, 4, torch.device("cuda", 0), SHARE, 1) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setattr(host_threads, "offloads_optimizer", lambda recipe, world: False)
    assert limit_host_threads(planned, 4, torch.device("cuda", 0), SHARE, 1) is None and calls == [1]


def test_an_optimizer_offloaded_to_the_host_is_seen_in_the_zero_overrides():
    plain = recipe(decode_workers=14)
    offloaded = recipe_with(plain, "zero", overrides={"offload_optimizer": {"device": "cpu"}})
    assert not host_threads.offloads_optimizer(plain, 4)
    assert host_threads.offloads_optimizer(offloaded, 4)
