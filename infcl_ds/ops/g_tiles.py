"""The G-tile walk every loss's backward shares: a block ``a @ b.T`` is walked in tiles of
rows x panel columns, a loss's kernel turns each tile of similarities into its derivative G,
and two dense GEMMs (fp32 accumulation) carry G to both features' gradients. This module
sizes the tiles from memory, walks them and does the GEMMs; ops/block.py (CLIP) and
ops/siglip_sweep.py supply the kernels that fill G.
"""
import contextlib
import functools
import math
from typing import List, Optional, Tuple

import torch

# Extra memory the panel may take beyond its O(B*D) share.
PANEL_SLACK_BYTES = 32 << 20
# The most one G tile (rows x panel columns) may hold. Beyond it the rows are walked in
# slices too, so that G stays a constant rather than ~4 D bytes per local sample: at a
# local batch of 512k x 512 that is 256 MiB instead of 1 GiB. Below ~128k rows (bf16,
# D = 512) a G tile holds every row: one row slice.
PANEL_MAX_BYTES = 256 << 20


def panel_width(n_a: int, n_b: int, D: int, bytes_per_elem: int) -> int:
    """Columns per panel: the panel costs about as much as two feature rows per sample
    (4*D bytes), plus PANEL_SLACK_BYTES; a multiple of 256 (whole tiles), within [256, n_b]."""
    width = (4 * D * n_a + PANEL_SLACK_BYTES) // (max(n_a, 1) * bytes_per_elem)
    return int(max(1, min(n_b, max(256, width // 256 * 256))))


def panel_rows(n_a: int, width: int, bytes_per_elem: int) -> int:
    """Rows per G tile: all of them while the tile fits PANEL_MAX_BYTES, else a multiple of
    256 rows that does (at least 256)."""
    rows = PANEL_MAX_BYTES // (max(width, 1) * bytes_per_elem)
    return int(max(1, min(n_a, max(256, rows // 256 * 256))))


def row_slices(n_a: int, height: int) -> List[Tuple[int, int]]:
    """(first row, rows) of each G tile's row slice, at most ``height`` rows each: as few slices
    as that allows, in whole 256-row units spread evenly (sizes within 512 rows of each other),
    not full slices and a remainder: a remainder of a few hundred rows (512 of 512k at D = 768)
    would be a problem class of its own to the tile tuning (ops/tuning.py), compiled or tuned at
    its first call and run at a small problem's rate. A height that is not a multiple of 256
    (tests' ``rows``) cuts plain slices of it."""
    if height >= n_a or height % 256:
        return [(i0, min(height, n_a - i0)) for i0 in range(0, n_a, height)]
    slices, units = math.ceil(n_a / height), math.ceil(n_a / 256)
    out, start = [], 0
    for k in range(slices):
        rows = (units // slices + (k < units % slices)) * 256  # <= height: n_a <= slices * height
        out.append((start, min(rows, n_a - start)))
        start += out[-1][1]
    return out


def g_tile_shape(n_a: int, n_b: int, dim: int, g_bytes: int, panel: Optional[int] = None,
                 rows: Optional[int] = None) -> Tuple[int, int]:
    """(rows, columns) of the G tile for a block of n_a x n_b, G taking ``g_bytes`` per element;
    ``panel``/``rows`` given (tests) instead of derived from memory."""
    width = min(panel or panel_width(n_a, n_b, dim, g_bytes), n_b)
    return min(rows or panel_rows(n_a, width, g_bytes), n_a), width


def g_tile_bytes(n_a: int, n_b: int, dim: int, elem: int) -> int:
    """Bytes of the G tile walk_g_tiles allocates on a GPU for a block of n_a x n_b with gradients
    (Triton writes G in the features' ``elem``-byte dtype), for the planner: at most about
    PANEL_MAX_BYTES whatever the block."""
    height, width = g_tile_shape(n_a, n_b, dim, elem)
    return height * width * elem


@contextlib.contextmanager
def _matmul_precision(allow_tf32: bool):
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@functools.lru_cache(maxsize=None)
def addmm_takes_out_dtype(device: torch.device, operands: torch.dtype, out: torch.dtype) -> bool:
    """Whether this torch can write ``operands`` products straight into an ``out`` tensor
    (``torch.addmm(..., out_dtype=)``, recent torch on CUDA). Probed once per device and
    dtypes on 2 x 2 tensors, so that an error of a real call (out of memory above all) is
    never taken for a missing capability."""
    try:
        a = torch.zeros((2, 2), device=device, dtype=operands)
        c = torch.zeros((2, 2), device=device, dtype=out)
        torch.addmm(c, a, a, out_dtype=out, out=c)
    except (RuntimeError, TypeError):
        return False
    return True


def _direct_accumulation(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> bool:
    """cuBLAS can read and write the fp32 C directly: no fp32 temporary of the product."""
    return out.is_cuda and x.dtype == y.dtype and addmm_takes_out_dtype(out.device, x.dtype, out.dtype)


def gemm_into(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float, accumulate: bool) -> None:
    """out (+)= alpha * x @ y, with fp32 accumulation whatever the operands' dtype."""
    beta = 1.0 if accumulate else 0.0
    if out.dtype == x.dtype == y.dtype:
        torch.addmm(out, x, y, beta=beta, alpha=alpha, out=out)
        return
    if _direct_accumulation(out, x, y):
        torch.addmm(out, x, y, beta=beta, alpha=alpha, out_dtype=out.dtype, out=out)
        return
    product = x.float() @ y.float()
    if accumulate:
        out.add_(product, alpha=alpha)
    else:
        torch.mul(product, alpha, out=out)


def walk_g_tiles(a, b, fill, total: torch.Tensor, coef: float, *, diag: bool,
                 grad_a: Optional[torch.Tensor], grad_b: Optional[torch.Tensor], accumulate_b: bool,
                 backend: str, allow_tf32=True, panel=None, rows=None) -> torch.Tensor:
    """Walk the block ``a @ b.T`` in G tiles (rows x panel columns) and multiply each out.

    The pattern every loss here shares: a kernel turns one tile of similarities into the
    loss's derivative G with respect to them, and two dense GEMMs carry G to the features.

    fill(g, a_rows, b_panel, i0, j0, diag_offset) writes the tile's G into ``g`` and returns
    its partial sums (any tensor); they are added into ``total``, which is returned.
    diag_offset: None when the tile holds no positive pair, else row m pairs with tile
    column m - diag_offset. backend: already resolved ("triton" or "torch").
    grad_a/grad_b: as for ops/block.py's block_backward; both None walks the tiles for
    ``total`` only (nothing multiplied out; ``g`` may then be a scratch buffer the fill ignores).
    """
    n_a, n_b = a.shape[0], b.shape[0]
    # Triton writes G in the features' dtype for the tensor cores; the CPU path keeps fp32.
    g_dtype = a.dtype if backend == "triton" else torch.float32
    g_bytes = g_dtype.itemsize if backend == "triton" else 12
    height, width = g_tile_shape(n_a, n_b, a.shape[1], g_bytes, panel, rows)
    with_grads = grad_a is not None
    # Without gradients a 1-element scratch stands in for G (a kernel argument must point somewhere).
    g_buf = torch.empty((height, width) if with_grads else (1, 1), device=a.device, dtype=g_dtype)
    sliced = with_grads and height < n_a and grad_b.dtype != torch.float32
    b_sum = torch.empty((width, b.shape[1]), device=a.device, dtype=torch.float32) if sliced else None
    with _matmul_precision(allow_tf32):
        for j0 in range(0, n_b, width):
            b_panel = b[j0:j0 + width]
            n_cols = b_panel.shape[0]
            for i0, n_rows in row_slices(n_a, height):
                a_rows = a[i0:i0 + n_rows]
                g = g_buf[:a_rows.shape[0], :n_cols] if with_grads else g_buf
                # Row i0 + m pairs with column i0 + m, i.e. panel column m - (j0 - i0).
                offset = j0 - i0 if diag and _crosses_diagonal(i0, a_rows.shape[0], j0, n_cols) else None
                total += fill(g, a_rows, b_panel, i0, j0, offset)
                if not with_grads:
                    continue
                gemm_into(grad_a[i0:i0 + n_rows], g, b_panel, coef, accumulate=True)
                if sliced:
                    gemm_into(b_sum[:n_cols], g.T, a_rows, coef, accumulate=i0 > 0)
                else:
                    gemm_into(grad_b[j0:j0 + width], g.T, a_rows, coef, accumulate=accumulate_b or i0 > 0)
            if sliced:
                out = grad_b[j0:j0 + width]
                out.add_(b_sum[:n_cols]) if accumulate_b else out.copy_(b_sum[:n_cols])
    return total


def _crosses_diagonal(i0: int, n_rows: int, j0: int, n_cols: int) -> bool:
    """Whether rows [i0, i0+n_rows) and columns [j0, j0+n_cols) share an index."""
    return i0 < j0 + n_cols and j0 < i0 + n_rows
