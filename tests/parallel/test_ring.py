"""The ring on real gloo ranks (spawned processes) against a float64 single-process
reference on the concatenated batch: the loss on every rank, each rank's feature gradients
and the full logit-scale gradient. World sizes 1-4 (from three ranks the two neighbours
differ, so direction and peer bugs show), uneven local batches, fp32 and bf16, the Triton
kernels (interpreter) and the CPU PyTorch path. Tolerances as in test_loss.py."""
import os
import time

import pytest
import torch

from reference import clip_loss_reference, rel_err
from devices import DEVICE, EXACT, GPU, cpu_only
from dist_utils import on_ring, run_ranks
from features import random_features

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-5, 1e-5, 1e-5), torch.bfloat16: (1e-4, 1e-2, 1e-3)}


def global_batch(sizes, D, dtype, seed):
    total = sum(sizes)
    return random_features(total, D, dtype, seed), random_features(total, D, dtype, seed + 1)


def _ring_cases(rank, world, cases, group_ranks=None):
    return on_ring(rank, group_ranks, _ring_case, cases)


def _ring_case(case, group, pos):
    from infcl_ds import contrastive_loss
    sizes, D, dtype, s, backend, seed, tiles = case
    image, text = global_batch(sizes, D, dtype, seed)
    lo = sum(sizes[:pos])
    image = image[lo:lo + sizes[pos]].clone().requires_grad_()
    text = text[lo:lo + sizes[pos]].clone().requires_grad_()
    scale = torch.tensor(s, requires_grad=True, device=image.device)
    loss = contrastive_loss(image, text, scale, group=group, backend=backend, **EXACT, **(tiles or {}))
    loss.backward()
    return loss.item(), image.grad, text.grad, scale.grad


def check_against_reference(results, cases, order):
    for k, (sizes, D, dtype, s, backend, seed, _tiles) in enumerate(cases):
        image, text = global_batch(sizes, D, dtype, seed)
        ref_loss, ref_i, ref_t, ref_s = clip_loss_reference(image, text, torch.tensor(s))
        tol_loss, tol_feat, tol_scale = TOL[dtype]
        for pos, rank in enumerate(order):
            loss, gi, gt, gs = results[rank][k]
            lo, hi = sum(sizes[:pos]), sum(sizes[:pos + 1])
            where = f"case {k} {sizes} D={D} {dtype} {backend} rank {rank}"
            assert abs(loss - ref_loss.item()) <= tol_loss * max(1, abs(ref_loss.item())) + 1e-6 * s, where
            assert gi.dtype == dtype and gi.shape == (sizes[pos], D), where
            assert rel_err(gi, ref_i[lo:hi]) <= tol_feat, where
            assert rel_err(gt, ref_t[lo:hi]) <= tol_feat, where
            assert rel_err(gs, ref_s) <= tol_scale, where


def cases_for(world):
    even = [37] * world
    uneven = [13 + 29 * r for r in range(world)]  # the last batch of an epoch
    return [
        (even, 80, torch.float32, 1 / 0.07, "triton", 1, None),
        # Small G tiles: several column panels and row slices per block, the diagonal
        # crossing them at every offset (the default tiles are whole blocks at these sizes).
        (uneven, 96, torch.bfloat16, 100.0, "triton", 2, {"_g_tile": (64, 32)}),
        (uneven, 80, torch.float32, 100.0, "torch", 3, {"_g_tile": (32, 24)}),
        (even, 96, torch.bfloat16, 1 / 0.07, "torch", 4, None),
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_matches_single_process_reference(world):
    cases = cases_for(world)
    results = run_ranks(_ring_cases, world, cases)
    check_against_reference(results, cases, list(range(world)))


def test_ring_on_a_subgroup_follows_group_order():
    # Ranks 1, 2, 3 of four: the global batch is their local batches in group order.
    cases = [([20, 45, 31], 80, torch.float32, 20.0, "torch", 5, None),
             ([20, 45, 31], 96, torch.float32, 20.0, "triton", 6, None)]
    results = run_ranks(_ring_cases, 4, cases, [1, 2, 3])
    assert results[0] == []
    check_against_reference(results, cases, [1, 2, 3])


def _mismatch(rank, world, kind):
    from infcl_ds import contrastive_loss
    n, d, dtype = 8, 16, torch.float32
    if kind == "width" and rank == 2:
        d = 24
    if kind == "dtype" and rank == 1:
        dtype = torch.bfloat16
    image, text = torch.randn(n, d, device=DEVICE).to(dtype), torch.randn(n, d, device=DEVICE).to(dtype)
    if kind == "nan" and rank == 1:
        image[3, 3] = float("nan")
    if kind == "shape" and rank == 0:
        text = torch.randn(n + 1, d, device=DEVICE)
    try:
        contrastive_loss(image, text, torch.tensor(10.0, device=DEVICE))
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("kind,expected", [
    ("width", "width D differs across ranks"),
    ("dtype", "dtype differs across ranks"),
    ("nan", "rank 1: image_features contains NaN"),
    ("shape", "rank 0: batch mismatch"),
])
def test_bad_input_on_one_rank_raises_on_every_rank(kind, expected):
    results = run_ranks(_mismatch, 3, kind)
    for rank in range(3):
        assert expected in results[rank], (rank, results[rank])


def _peer_fails(rank, world, how, phase):
    from infcl_ds import contrastive_loss
    from infcl_ds.parallel.ring import RingError

    import infcl_ds.parallel.clip_function as clip_function
    name = "block_lse" if phase == "forward" else "block_backward"
    calls = {"n": 0}
    original = getattr(clip_function, name)

    def failing(*args, **kw):
        calls["n"] += 1
        if rank == 1 and calls["n"] == 2:  # in the middle of this pass's ring
            if how == "dies":
                os._exit(3)
            if how == "hangs":
                time.sleep(20)  # alive but silent: only the timeout can stop its peers
            raise RuntimeError("injected failure on rank 1")
        return original(*args, **kw)

    setattr(clip_function, name, failing)
    image, text = torch.randn(16, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    t0 = time.monotonic()
    try:
        contrastive_loss(image, text, torch.tensor(10.0), backend="torch").backward()
    except RingError as err:
        return ("RingError", str(err), time.monotonic() - t0)
    return ("finished", "", time.monotonic() - t0)


@cpu_only("fault behaviour on gloo; NCCL surfaces failures later (docs/semantics.md)")
@pytest.mark.parametrize("phase,how", [("forward", "dies"), ("forward", "raises"), ("forward", "hangs"),
                                       ("backward", "dies"), ("backward", "raises")])
def test_dead_failing_or_stuck_peer_stops_the_others_with_a_clear_error(phase, how):
    # A dead or raising peer closes its connections: the others fail at once (gloo). A stuck
    # one is caught by the process group's timeout (deepspeed.init_distributed(timeout=...),
    # here 8 s): no silent hang either way, in the forward ring or the backward's.
    results = run_ranks(_peer_fails, 3, how, phase, timeout_s=8, wait_s=120, allow_errors=True)
    for rank in (0, 2):
        kind, message, seconds = results[rank]
        assert kind == "RingError" and "infcl_ds ring" in message, results[rank]
        assert seconds < 30, seconds
