"""The kernel primitives on their own, on the non-square blocks the ring hands them."""
import pytest
import torch

from infcl_ds.ops import block_lse
from infcl_ds.ops import g_tiles
from infcl_ds.ops.block import block_backward
from infcl_ds.ops.g_tiles import panel_width
from reference import rel_err
from devices import EXACT
from features import random_features

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("n_a,n_b,D", [(1, 300, 8), (300, 1, 80), (65, 257, 96), (200, 70, 640)])
def test_block_lse_non_square(n_a, n_b, D, backend):
    a, b = random_features(n_a, D, torch.float32, n_a), random_features(n_b, D, torch.float32, n_b + 1)
    s = torch.tensor([37.0])
    row, col = block_lse(a, b, s, backend=backend, **EXACT)
    logits = 37.0 * a.double() @ b.double().T
    assert rel_err(row, torch.logsumexp(logits, 1)) < 1e-6
    assert rel_err(col, torch.logsumexp(logits, 0)) < 1e-6


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("diag", [True, False])
def test_block_backward_accumulates(backend, diag):
    n_a, n_b, D = 130, (130 if diag else 77), 80
    a, b = random_features(n_a, D, torch.float32, 11), random_features(n_b, D, torch.float32, 12)
    s = torch.tensor([12.0])
    logits = 12.0 * a.double() @ b.double().T
    # Statistics of some larger batch: anything finite and >= the block's own lse works.
    r = torch.logsumexp(logits, 1) + 0.3
    c = torch.logsumexp(logits, 0) + 0.7
    G = torch.exp(logits - r[:, None]) + torch.exp(logits - c[None, :])
    if diag:
        G -= 2 * torch.eye(n_a, dtype=torch.float64)
    coef = 0.01
    grad_a = torch.ones(n_a, D)              # accumulates onto what is there
    grad_b = torch.full((n_b, D), 2.0)       # accumulate_b=True: likewise
    ds = block_backward(a, b, s, r.float(), c.float(), coef, diag=diag, grad_a=grad_a, grad_b=grad_b,
                        accumulate_b=True, backend=backend, panel=32, **EXACT)
    assert rel_err(grad_a, 1 + coef * G @ b.double()) < 1e-6
    assert rel_err(grad_b, 2 + coef * G.T @ a.double()) < 1e-6
    assert rel_err(ds, (G * (a.double() @ b.double().T)).sum()) < 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("diag,accumulate_b,b_dtype", [(True, False, torch.bfloat16), (False, True, torch.float32),
                                                        (True, True, torch.float32)])
@pytest.mark.parametrize("n_a,rows", [(130, 40), (1300, 1024)])
def test_block_backward_in_row_slices(backend, diag, accumulate_b, b_dtype, n_a, rows):
    # rows=40 over 130 rows (4 slices, the last partial), or 1024 over 1300 (two slices of
    # whole 256-row units spread evenly: 768 and 532), panel=32 columns: every tile's product
    # lands once in grad_a and grad_b whatever the slicing.
    n_b, D = (n_a if diag else 77), 80
    a, b = random_features(n_a, D, torch.float32, 21), random_features(n_b, D, torch.float32, 22)
    logits = 9.0 * a.double() @ b.double().T
    r, c = torch.logsumexp(logits, 1) + 0.2, torch.logsumexp(logits, 0) + 0.4
    G = torch.exp(logits - r[:, None]) + torch.exp(logits - c[None, :])
    if diag:
        G -= 2 * torch.eye(n_a, dtype=torch.float64)
    coef = 0.01
    grad_a = torch.zeros(n_a, D)
    grad_b = torch.full((n_b, D), 2.0, dtype=b_dtype)
    ds = block_backward(a, b, torch.tensor([9.0]), r.float(), c.float(), coef, diag=diag, grad_a=grad_a,
                        grad_b=grad_b, accumulate_b=accumulate_b, backend=backend, panel=32, rows=rows, **EXACT)
    want_b = coef * G.T @ a.double() + (2 if accumulate_b else 0)
    assert rel_err(grad_a, coef * G @ b.double()) < 1e-6
    assert rel_err(grad_b, want_b) < (1e-6 if b_dtype == torch.float32 else 4e-3)
    assert rel_err(ds, (G * (a.double() @ b.double().T)).sum()) < 1e-5


def test_g_tile_is_capped_whatever_the_batch():
    from infcl_ds.ops.g_tiles import PANEL_MAX_BYTES, panel_rows
    for n_a in (1, 1000, 1 << 17, 1 << 20, 12 << 20):
        width = min(panel_width(n_a, n_a, 768, 2), n_a)
        rows = panel_rows(n_a, width, 2)
        assert 1 <= rows <= n_a and (rows == n_a or rows % 256 == 0)
        assert rows * width * 2 <= max(PANEL_MAX_BYTES, 256 * width * 2)
    assert panel_rows(1 << 16, 1536, 2) == 1 << 16  # 64k x 768: all rows in one slice


@pytest.mark.parametrize("n_a,height", [(1, 1), (130, 40), (1300, 1024), (1300, 256), (524288, 87296),
                                        (2097152, 58112), (12 << 20, 58112), (523777, 75008)])
def test_row_slices_cover_the_rows_in_even_whole_units(n_a, height):
    """As few slices as the height allows, each within it, in whole 256-row units spread evenly
    (a 256-multiple height): no small remainder, a problem class of its own to the tile tuning
    (at 512k rows and D = 768 the largest slices that fit left 512 rows)."""
    from infcl_ds.ops.g_tiles import row_slices
    slices = row_slices(n_a, height)
    starts, sizes = [s for s, _ in slices], [n for _, n in slices]
    assert starts == [sum(sizes[:k]) for k in range(len(sizes))] and sum(sizes) == n_a
    assert len(slices) == -(-n_a // height) and max(sizes) <= height
    if height % 256 == 0 and height < n_a:
        assert all(n % 256 == 0 for n in sizes[:-1]) and max(sizes) - min(sizes) < 512
    if n_a >= 1 << 19:
        from infcl_ds.ops.tuning import TUNE_ROWS
        assert min(sizes) >= max(TUNE_ROWS, height // 2)  # the large problems' class of the tuning


def test_panel_width_is_bounded_by_memory():
    # bf16 G at B=1M, D=768: about 2D columns (~2 feature rows per sample), whole tiles.
    w = panel_width(1 << 20, 1 << 20, 768, 2)
    assert w % 256 == 0 and 1536 <= w <= 1792
    assert panel_width(10, 7, 768, 2) == 7


def test_addmm_capability_is_probed_once_and_a_real_error_propagates(monkeypatch):
    """The fp32-accumulating addmm is chosen by a cached probe on 2 x 2 tensors; an error of a
    production call (here a simulated out-of-memory) reaches the caller and changes nothing."""
    g_tiles.addmm_takes_out_dtype.cache_clear()
    first = g_tiles.addmm_takes_out_dtype(torch.device("cpu"), torch.bfloat16, torch.float32)
    assert g_tiles.addmm_takes_out_dtype(torch.device("cpu"), torch.bfloat16, torch.float32) is first
    assert g_tiles.addmm_takes_out_dtype.cache_info().misses == 1
    out, x, y = torch.zeros(3, 4), torch.ones(3, 5, dtype=torch.bfloat16), torch.ones(5, 4, dtype=torch.bfloat16)
    monkeypatch.setattr(g_tiles, "_direct_accumulation", lambda *args: True)

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with monkeypatch.context() as m:
        m.setattr(torch, "addmm", out_of_memory)
        with pytest.raises(RuntimeError, match="out of memory"):
            g_tiles.gemm_into(out, x, y, 1.0, accumulate=False)
    assert g_tiles.addmm_takes_out_dtype.cache_info().misses == 1
    monkeypatch.setattr(g_tiles, "_direct_accumulation", lambda *args: False)
    g_tiles.gemm_into(out, x, y, 2.0, accumulate=False)  # the fp32-temporary path
    assert torch.equal(out, torch.full((3, 4), 10.0))


def test_tile_shapes_are_timed_for_large_problems_only(monkeypatch):
    """A problem below SMALL_ROWS takes the fixed small-problem tiles without timing a candidate;
    a larger one times every candidate once and keeps the fastest for its problem class."""
    from infcl_ds.ops import tuning
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("INFCL_DS_TILE", raising=False)
    monkeypatch.setattr(tuning, "_cache", {})
    timed = []

    def cost(cfg):
        return cfg.block_m * cfg.block_n * cfg.block_k * cfg.num_warps / cfg.num_stages

    def time_config(cfg):
        timed.append(cfg)
        return cost(cfg)

    gpu = torch.device("cuda", 0)  # only its type and index are read: no GPU needed
    small = tuning.pick_config("lse", 40, torch.float32, "ieee", gpu, time_config, tuning.SMALL_ROWS - 1)
    assert timed == [] and small == tuning.small_problem_config(40) == tuning.TileConfig(64, 64, 64, 4, 2)
    large = tuning.pick_config("lse", 40, torch.float32, "ieee", gpu, time_config, tuning.TUNE_ROWS)
    assert timed == list(tuning.GPU_CANDIDATES)
    assert large == min(tuning.GPU_CANDIDATES, key=cost)
    again = tuning.pick_config("lse", 40, torch.float32, "ieee", gpu, time_config, 4 * tuning.TUNE_ROWS)
    assert again == large and len(timed) == len(tuning.GPU_CANDIDATES)  # the same problem class: cached
