"""Forward statistics: row and column log-sum-exp of s * A @ B^T in one pass over the tiles.

Rows of the similarity matrix need an online reduction along a row, columns one along a
column, and there is no atomic log-sum-exp. The grid therefore splits the matrix into
``row_splits x col_splits`` super-blocks. A program walks its super-block row tile by row
tile: the row statistics of the current row tile stay in registers across its column
tiles; the column statistics of the super-block's columns live in a small private slice
of global memory that the program merges into once per tile (BLOCK_N floats against a
BLOCK_M x BLOCK_N x D product: free). Each program writes one partial per row and one per
column; the host merges the ``splits`` partials, O(splits * B) floats. Every tile is
computed once, and no B x B buffer exists.

All statistics are kept in log2 units inside the kernel (exp2/log2 are the native
instructions); the launcher returns natural-log values.
"""
import math

import torch
import triton
import triton.language as tl

from .layout import as_row_major
from .tiles import similarity_tile
from .tuning import TUNE_ROWS, TileConfig, interpreting, pick_config

LN2 = 0.6931471805599453


@triton.jit
def _merge_lse2(x, y):
    """log2(2^x + 2^y), safe where both are -inf."""
    mx = tl.maximum(x, y)
    empty = mx == float("-inf")
    mx_safe = tl.where(empty, 0.0, mx)
    total = tl.exp2(x - mx_safe) + tl.exp2(y - mx_safe)
    return tl.where(empty, float("-inf"), mx_safe + tl.log2(tl.where(empty, 1.0, total)))


@triton.jit
def _tile_lse2(z, row_ok, col_ok):
    """Row and column log2-sum-exp2 of one tile z (invalid entries -inf, at least one valid).

    The exponential is the forward's bottleneck next to the tensor cores (16 per clock per SM
    against ~1000 multiply-adds), so the whole tile shares one shift, its max M: one exp2
    per element feeds both sums. That is exact as long as no valid row or column sum
    underflows, i.e. every row's and column's own max is within ~100 (log2 units) of M:
    always for typical features; with s near 100 and very uneven rows the tile falls back
    to a shift per row and per column (two exponentials per element).
    """
    tile_max = tl.max(tl.max(z, 1), 0)
    e = tl.exp2(z - tile_max)
    r_sum = tl.sum(e, 1)
    c_sum = tl.sum(e, 0)
    r_low = tl.min(tl.where(row_ok, r_sum, 1.0), 0)
    c_low = tl.min(tl.where(col_ok, c_sum, 1.0), 0)
    if (r_low > 7.9e-31) & (c_low > 7.9e-31):  # 2^-100
        row_t = tile_max + tl.log2(tl.where(row_ok, r_sum, 1.0))
        col_t = tile_max + tl.log2(tl.where(col_ok, c_sum, 1.0))
    else:
        r_max = tl.where(row_ok, tl.max(z, 1), 0.0)
        c_max = tl.where(col_ok, tl.max(z, 0), 0.0)
        row_t = r_max + tl.log2(tl.where(row_ok, tl.sum(tl.exp2(z - r_max[:, None]), 1), 1.0))
        col_t = c_max + tl.log2(tl.where(col_ok, tl.sum(tl.exp2(z - c_max[None, :]), 0), 1.0))
    return tl.where(row_ok, row_t, float("-inf")), tl.where(col_ok, col_t, float("-inf"))


@triton.jit
def _similarity_lse_kernel(
    A, B, SCALE, ROW_PART, COL_PART,
    n_a, n_b, D, stride_a, stride_b,
    row_splits, col_splits,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Partial log2-sum-exp2 of the rows and columns of one super-block of s*A@B^T.

    A [n_a, D], B [n_b, D]: features, row stride stride_a/stride_b (any), last stride 1.
    SCALE: pointer to the fp32 logit multiplier s (read on device: no host sync).
    ROW_PART [col_splits, n_a], COL_PART [row_splits, n_b]: fp32, pre-filled with -inf;
      program (r, c) writes ROW_PART[c, its rows] and merges into COL_PART[r, its cols].
    """
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    scale_log2 = tl.load(SCALE).to(tl.float32) * 1.4426950408889634
    rows_per_split = tl.cdiv(tl.cdiv(n_a, row_splits), BLOCK_M) * BLOCK_M
    cols_per_split = tl.cdiv(tl.cdiv(n_b, col_splits), BLOCK_N) * BLOCK_N
    row_begin = pid_r * rows_per_split
    row_end = tl.minimum(row_begin + rows_per_split, n_a)
    col_begin = pid_c * cols_per_split
    col_end = tl.minimum(col_begin + cols_per_split, n_b)
    # A program whose column range is empty (more splits than column tiles) has nothing to
    # add: its partials stay -inf as the launcher filled them.
    row_end = tl.where(col_begin < col_end, row_end, row_begin)

    for m0 in range(row_begin, row_end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < row_end
        # Running log2-sum-exp2 of this row tile: registers, across all column tiles.
        row_run = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        for n0 in range(col_begin, col_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            col_ok = offs_n < col_end
            z = similarity_tile(A, B, offs_m, offs_n, D, stride_a, stride_b, row_ok, col_ok,
                                BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, INPUT_PRECISION)
            z = tl.where(row_ok[:, None] & col_ok[None, :], z * scale_log2, float("-inf"))
            row_t, col_t = _tile_lse2(z, row_ok, col_ok)
            row_run = _merge_lse2(row_run, row_t)
            # Columns: merged into this super-block's partial in global memory.
            col_ptrs = COL_PART + pid_r * n_b + offs_n
            old = tl.load(col_ptrs, mask=col_ok, other=float("-inf"))
            tl.store(col_ptrs, _merge_lse2(old, col_t), mask=col_ok)
            # The next row tile re-reads these columns from other threads: make the
            # stores visible CTA-wide first.
            tl.debug_barrier()
        tl.store(ROW_PART + pid_c * n_a + offs_m, row_run, mask=row_ok)


def _splits(n: int, device: torch.device) -> int:
    """Super-blocks per side: ~4 programs per SM in total, never more than one per 64 rows."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4
    return max(1, min(math.ceil(math.sqrt(4 * sms)), triton.cdiv(n, 64)))


def _launch(a, b, scale, cfg: TileConfig, input_precision: str):
    n_a, D = a.shape
    n_b = b.shape[0]
    rs, cs = _splits(n_a, a.device), _splits(n_b, a.device)
    row_part = torch.full((cs, n_a), float("-inf"), device=a.device, dtype=torch.float32)
    col_part = torch.full((rs, n_b), float("-inf"), device=a.device, dtype=torch.float32)
    _similarity_lse_kernel[(rs, cs)](
        a, b, scale, row_part, col_part, n_a, n_b, D, a.stride(0), b.stride(0), rs, cs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=D % cfg.block_k == 0, UPCAST=interpreting(), INPUT_PRECISION=input_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return row_part, col_part


def similarity_lse(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, input_precision: str = "tf32"):
    """Row and column log-sum-exp (natural log, fp32) of ``scale * a @ b.T``.

    a [n_a, D], b [n_b, D] with the same dtype and device, any strides (one that is not
    row-major is copied once: ops/layout.py); scale: 1-element fp32 tensor on the same device.
    Returns (row_lse [n_a], col_lse [n_b]).
    """
    a, b = as_row_major(a), as_row_major(b)
    D = a.shape[1]

    def time_config(cfg):
        n = min(TUNE_ROWS, a.shape[0], b.shape[0])
        return triton.testing.do_bench(lambda: _launch(a[:n], b[:n], scale, cfg, input_precision),
                                       warmup=5, rep=20, return_mode="median")

    cfg = pick_config("lse", D, a.dtype, input_precision, a.device, time_config, a.shape[0])
    row_part, col_part = _launch(a, b, scale, cfg, input_precision)
    return torch.logsumexp(row_part * LN2, 0), torch.logsumexp(col_part * LN2, 0)
