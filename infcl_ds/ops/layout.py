"""The one layout the kernels and the G-tile walk's GEMMs read features in: row-major [n, D].

The similarity tile (tiles.py) steps along a row by pointer increments and between rows by
the row stride, so the last stride must be 1 (a transposed view, every other column or
features expanded along D would be read wrongly, or past their storage). cuBLAS also wants
rows that do not overlap (row stride >= D): given rows of stride 0 (expanded along the
batch) or overlapping rows, torch's addmm would copy the operand for every G tile. Any other
row stride and any offset are read as they are. A view outside this layout is copied once,
where a block or a launcher first sees it, and the G-tile walk then slices the copy.
"""
import torch


def is_row_major(x: torch.Tensor) -> bool:
    """Unit-stride, non-overlapping rows (a stride of a size-1 dimension is never followed)."""
    n, d = x.shape[-2], x.shape[-1]
    return (d <= 1 or x.stride(-1) == 1) and (n <= 1 or x.stride(-2) >= max(d, 1))


def as_row_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` [n, D] itself when row-major (contiguous, a row slice, an offset or row-strided
    view: no copy), else one contiguous copy."""
    return x if is_row_major(x) else x.contiguous()


def check_row_major(out: torch.Tensor, name: str) -> None:
    """A kernel's output is written in place, so it cannot be copied: refuse a layout the
    kernel would write wrongly (the G buffers the walk hands over are row-major)."""
    if not is_row_major(out):
        raise ValueError(f"{name} must be row-major (last stride 1, rows not overlapping), "
                         f"got shape {tuple(out.shape)} strides {tuple(out.stride())}")
