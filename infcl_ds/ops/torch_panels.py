"""The CPU path: the two kernel primitives in chunked PyTorch, with the same O(B*D) memory.

Used for CPU tensors when Triton's interpreter is off, so that CPU training is real
training rather than a crawl through interpreted tiles. Each call materialises at most one
[n_a, panel] fp32 slice of the similarity matrix; ops/g_tiles.py picks the panel width.
"""
import torch


def similarity_lse(a, b, scale, panel_width: int):
    """Row and column log-sum-exp (natural log, fp32) of ``scale * a @ b.T``, panel by panel."""
    a32 = a.float()
    row = torch.full((a.shape[0],), float("-inf"), dtype=torch.float32, device=a.device)
    col = torch.empty(b.shape[0], dtype=torch.float32, device=a.device)
    for j0 in range(0, b.shape[0], panel_width):
        z = (a32 @ b[j0:j0 + panel_width].float().T) * scale
        row = torch.logaddexp(row, torch.logsumexp(z, 1))
        col[j0:j0 + z.shape[1]] = torch.logsumexp(z, 0)
    return row, col


def grad_panel(a, b, scale, row_lse, col_lse, out, diag_offset=None):
    """Same contract as ops.grad_panel.grad_panel: out <- P + Q - 2*delta; returns sum(G * a@b.T)."""
    x = a.float() @ b.float().T
    z = x * scale
    g = torch.exp(z - row_lse[:, None]) + torch.exp(z - col_lse[None, :])
    if diag_offset is not None:
        cols = torch.arange(b.shape[0], device=a.device)
        rows = cols + diag_offset
        keep = (rows >= 0) & (rows < a.shape[0])
        g[rows[keep], cols[keep]] -= 2.0
    out.copy_(g)
    return (g * x).sum()
