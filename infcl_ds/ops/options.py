"""How a loss is computed (never what): the one options class every loss Function takes, and
the implementation its backend names on a device."""
from dataclasses import dataclass
from typing import Optional

import torch

from .tuning import interpreting


@dataclass(frozen=True)
class KernelOptions:
    """backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, chunked PyTorch on CPU),
    "triton" or "torch". allow_tf32: fp32 inputs use TF32 tensor cores (no effect on
    bf16/fp16). panel, panel_rows: columns and rows of the backward's G tiles, None =
    derived from memory; only tests set them, to put tile edges at awkward places."""
    backend: str = "auto"
    allow_tf32: bool = False
    panel: Optional[int] = None
    panel_rows: Optional[int] = None


def tf32_by_default() -> bool:
    """PyTorch's own convention for fp32 products: IEEE unless the program asked for TF32 with
    torch.set_float32_matmul_precision("high"/"medium") or
    torch.backends.cuda.matmul.allow_tf32 = True (which sets the same precision)."""
    return torch.get_float32_matmul_precision() != "highest"


BACKENDS = ("auto", "triton", "torch")


def resolve_backend(backend: str, device: torch.device) -> str:
    """"triton" or "torch" for ``backend`` on ``device`` (see KernelOptions); ValueError for an
    unknown backend, or Triton on CPU tensors without the interpreter."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" or interpreting() else "torch"
    if backend == "triton" and device.type != "cuda" and not interpreting():
        raise ValueError("backend='triton' on CPU tensors needs TRITON_INTERPRET=1")
    return backend
