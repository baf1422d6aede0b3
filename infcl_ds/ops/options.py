"""How a loss is computed (never what): the one options class every loss Function takes."""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class KernelOptions:
    """backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, chunked PyTorch on CPU),
    "triton" or "torch". allow_tf32: fp32 inputs use TF32 tensor cores (no effect on
    bf16/fp16). panel, panel_rows: columns and rows of the backward's G tiles, None =
    derived from memory; only tests set them, to put tile edges at awkward places."""
    backend: str = "auto"
    allow_tf32: bool = True
    panel: Optional[int] = None
    panel_rows: Optional[int] = None

