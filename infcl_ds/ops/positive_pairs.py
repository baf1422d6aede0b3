"""What the CLIP loss Function (parallel/clip_function.py) takes from this layer besides the
block kernels (ops/block.py): the positive-pair sum."""
import torch


def positive_logits_sum(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 16) -> torch.Tensor:
    """sum_i a_i . b_i: row dots in fp32, their sum in fp64 (the loss subtracts s times this
    from the log-sum-exps, a difference of O(s) numbers). Chunked: no [B, D] fp32 copy."""
    total = torch.zeros((), device=a.device, dtype=torch.float64)
    for i in range(0, a.shape[0], chunk):
        total += (a[i:i + chunk].float() * b[i:i + chunk].float()).sum(1).double().sum()
    return total
