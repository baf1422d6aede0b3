"""Backward: one recomputation of each similarity tile gives both loss directions' gradient.

For the bidirectional CLIP loss over a batch of B pairs, with S = s * A @ B^T, row
statistics r and column statistics c (both log-sum-exp, saved by the forward),

    dL/dS_ij = (P_ij + Q_ij - 2 [i pairs with j]) / (2B),
    P_ij = exp(S_ij - r_i)  (image -> text softmax),  Q_ij = exp(S_ij - c_j)  (text -> image).

This kernel recomputes a panel of S (all rows of A against a slice of B's rows) and writes
G = P + Q - 2*delta in the feature dtype. The diagonal is folded in here, in fp32, because
P_ii + Q_ii - 2 is a small difference of numbers near 2 once training has converged: taken
apart, bf16 rounding of P_ii would swamp it. The caller multiplies G by the features with
two dense GEMMs (dA += G @ B_panel, dB_panel = G^T @ A): D = 512-1280 is far too wide for a
flash-attention-style register accumulator, and a panel of width ~2D keeps the extra
memory within O(B*D) while both products run at GEMM speed.

Each program also returns sum(G * A@B^T) over its tile in fp32, from the unrounded G:
the logit-scale gradient is that sum over all tiles / (2B).
"""
import torch
import triton
import triton.language as tl

from .layout import as_row_major, check_row_major
from .tiles import similarity_tile
from .tuning import TUNE_ROWS, TileConfig, interpreting, pick_config

LOG2E = 1.4426950408889634


@triton.jit
def _grad_panel_kernel(
    A, B, SCALE, ROW_LSE2, COL_LSE2, G, DS_PART,
    n_a, n_b, D, stride_a, stride_b, stride_g, diag_offset,
    HAS_DIAG: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """G[i, j] = 2^(z_ij - r_i) + 2^(z_ij - c_j) - 2*[i == j + diag_offset], z = s*log2(e)*A_i.B_j.

    A [n_a, D], B [n_b, D] (the panel): any row strides, last stride 1. SCALE: pointer to fp32 s.
    ROW_LSE2 [n_a], COL_LSE2 [n_b]: the complete statistics in log2 units.
    G [n_a, n_b] (row stride stride_g, last stride 1), written in G's dtype.
    DS_PART [grid_m * grid_n]: per-program sum of G * (A_i . B_j) in fp32.
    HAS_DIAG: this panel holds positive pairs (row i pairs with column i - diag_offset).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    scale_log2 = tl.load(SCALE).to(tl.float32) * 1.4426950408889634
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < n_a
    col_ok = offs_n < n_b
    # 1. Recompute the tile (fp32 accumulators).
    x = similarity_tile(A, B, offs_m, offs_n, D, stride_a, stride_b, row_ok, col_ok,
                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, INPUT_PRECISION)
    z = x * scale_log2
    # 2. Both softmaxes from the saved statistics, and the positive pairs, in fp32.
    r = tl.load(ROW_LSE2 + offs_m, mask=row_ok, other=0.0)
    c = tl.load(COL_LSE2 + offs_n, mask=col_ok, other=0.0)
    # One exponential per element when the tile's statistics lie within 100 (log2 units)
    # of each other (the usual case): with lo = their min, 2^(z-r) = 2^(z-lo) * 2^(lo-r),
    # where 2^(lo-r) <= 1 and 2^(z-lo) <= 2^100 (z <= r and z <= c). Else two.
    lo = tl.minimum(tl.min(tl.where(row_ok, r, float("inf")), 0), tl.min(tl.where(col_ok, c, float("inf")), 0))
    hi = tl.maximum(tl.max(tl.where(row_ok, r, float("-inf")), 0), tl.max(tl.where(col_ok, c, float("-inf")), 0))
    # Padding rows/columns get z = r = c = lo: finite, and zeroed below.
    valid = row_ok[:, None] & col_ok[None, :]
    r = tl.where(row_ok, r, lo)
    c = tl.where(col_ok, c, lo)
    z = tl.where(valid, z, lo)
    if hi - lo <= 100.0:
        e = tl.exp2(z - lo)
        g = e * (tl.exp2(lo - r)[:, None] + tl.exp2(lo - c)[None, :])
    else:
        g = tl.exp2(z - r[:, None]) + tl.exp2(z - c[None, :])
    if HAS_DIAG:
        g = tl.where(offs_m[:, None] == offs_n[None, :] + diag_offset, g - 2.0, g)
    g = tl.where(valid, g, 0.0)
    # 3. Logit-scale partial from the unrounded G; then G in the features' dtype.
    tl.store(DS_PART + pid_m * tl.num_programs(1) + pid_n, tl.sum(tl.sum(g * x, 1), 0))
    g_ptrs = G + offs_m.to(tl.int64)[:, None] * stride_g + offs_n[None, :]
    tl.store(g_ptrs, g.to(G.dtype.element_ty), mask=valid)


def _launch(a, b, scale, row_lse2, col_lse2, out, diag_offset, cfg: TileConfig, input_precision):
    n_a, D = a.shape
    n_b = b.shape[0]
    grid = (triton.cdiv(n_a, cfg.block_m), triton.cdiv(n_b, cfg.block_n))
    ds_part = torch.empty(grid[0] * grid[1], device=a.device, dtype=torch.float32)
    _grad_panel_kernel[grid](
        a, b, scale, row_lse2, col_lse2, out, ds_part,
        n_a, n_b, D, a.stride(0), b.stride(0), out.stride(0),
        0 if diag_offset is None else diag_offset,
        HAS_DIAG=diag_offset is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=D % cfg.block_k == 0, UPCAST=interpreting(), INPUT_PRECISION=input_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return ds_part.sum()


def grad_panel(a, b, scale, row_lse, col_lse, out, diag_offset=None, input_precision="tf32"):
    """Write G = P + Q - 2*delta for ``a`` against the panel ``b`` into ``out`` [n_a, n_b].

    a, b: any strides (one that is not row-major is copied: ops/layout.py; ops/block.py
    copies a block once, before slicing it into panels). out: written in place, so it must
    be row-major (ValueError otherwise). row_lse [n_a], col_lse [n_b]: complete
    natural-log statistics (fp32). diag_offset: None if the panel holds no positive pair,
    else row i pairs with panel column i - diag_offset. Returns the fp32 0-dim sum of
    G * (a @ b.T).
    """
    a, b = as_row_major(a), as_row_major(b)
    check_row_major(out, "grad_panel's out")
    row_lse2, col_lse2 = row_lse * LOG2E, col_lse * LOG2E
    D = a.shape[1]

    def time_config(cfg):
        n = min(TUNE_ROWS, a.shape[0])
        return triton.testing.do_bench(
            lambda: _launch(a[:n], b, scale, row_lse2[:n], col_lse2, out[:n], diag_offset, cfg, input_precision),
            warmup=5, rep=20, return_mode="median")

    cfg = pick_config("grad_panel", D, a.dtype, input_precision, a.device, time_config, a.shape[0])
    return _launch(a, b, scale, row_lse2, col_lse2, out, diag_offset, cfg, input_precision)
