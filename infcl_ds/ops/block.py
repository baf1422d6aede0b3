"""One block of the CLIP similarity matrix: statistics forward, both gradients backward.

A block is ``a`` (rows: this rank's images) against ``b`` (columns: a text block, local or
visiting in the ring). The single-device loss is one block; the ring runs one block per
step. This module launches the CLIP kernels (Triton on CUDA or under TRITON_INTERPRET=1,
chunked PyTorch otherwise) on the G tiles that ops/g_tiles.py walks.
"""
import torch

from . import grad_panel as triton_grad
from . import lse as triton_lse
from . import torch_panels
from .g_tiles import panel_width, walk_g_tiles
from .layout import as_row_major
from .options import resolve_backend


def block_lse(a, b, scale, *, backend="auto", allow_tf32=True, panel=None):
    """(row_lse [n_a], col_lse [n_b]) of ``scale * a @ b.T``, natural log, fp32.

    a, b: any strides; one that is not row-major is copied once (ops/layout.py)."""
    a, b = as_row_major(a), as_row_major(b)
    backend = resolve_backend(backend, a.device)
    if backend == "triton":
        return triton_lse.similarity_lse(a, b, scale, "tf32" if allow_tf32 else "ieee")
    width = panel or panel_width(a.shape[0], b.shape[0], a.shape[1], 12)
    return torch_panels.similarity_lse(a, b, scale, width)


def block_backward(a, b, scale, row_lse, col_lse, coef: float, *, diag: bool,
                   grad_a: torch.Tensor, grad_b: torch.Tensor, accumulate_b: bool,
                   backend="auto", allow_tf32=True, panel=None, rows=None) -> torch.Tensor:
    """Add ``coef * G @ b`` to grad_a and write (or add, if accumulate_b) ``coef * G^T @ a``
    to grad_b, with G = P + Q - 2*delta over this block; return sum(G * a@b.T) (fp64, 0-dim).

    row_lse/col_lse: the complete statistics of a's rows and b's rows (whole global batch).
    diag: the block holds the positive pairs on its diagonal (a and b from the same rank).
    grad_a: fp32 accumulator [n_a, D]; grad_b: [n_b, D], fp32 if accumulate_b. When G is
    walked in several row slices, their products for a bf16/fp16 grad_b add up in an fp32
    [panel, D] buffer first (rounded once).
    panel / rows: columns / rows per G tile (tests; default: panel_width and panel_rows).
    a, b: any strides; one that is not row-major is copied here, once per block, rather
    than by each G tile's kernel or GEMM (ops/layout.py).
    """
    a, b = as_row_major(a), as_row_major(b)
    backend = resolve_backend(backend, a.device)
    precision = "tf32" if allow_tf32 else "ieee"

    def fill(g, a_rows, b_panel, i0, j0, offset):
        row_part = row_lse[i0:i0 + a_rows.shape[0]]
        col_part = col_lse[j0:j0 + b_panel.shape[0]]
        if backend == "triton":
            return triton_grad.grad_panel(a_rows, b_panel, scale, row_part, col_part, g, offset, precision)
        return torch_panels.grad_panel(a_rows, b_panel, scale, row_part, col_part, g, offset)

    ds = torch.zeros((), device=a.device, dtype=torch.float64)
    return walk_g_tiles(a, b, fill, ds, coef, diag=diag, grad_a=grad_a, grad_b=grad_b, accumulate_b=accumulate_b,
                        backend=backend, allow_tf32=allow_tf32, panel=panel, rows=rows)
