"""Where a training step's GPU time goes: one step under torch.profiler, kernel time by kind.

`infcl-ds bench train --profile` runs one more step of each measured configuration under the
profiler (after its timed steps, so nothing is compiled or tuned inside it) and stores the
table in the row (`profile`). Kernels are classified by name, the first matching kind wins:
cuBLAS's GEMMs are `nvjet*`/`*gemm*`/`cutlass*`; the attention backend's kernels `flash*`
(FlashAttention), `fmha*` (memory-efficient) or `*sdpa*` (cuDNN), so the names also say which
scaled_dot_product_attention backend ran; compiled towers' fused kernels `triton_*` (norms,
GELU, bias and residual adds: "norms and elementwise"), except that inductor names a fused
kernel after the operations it fuses: its layout copies into and out of cuDNN attention
(`triton_*_scaled_dot_product_cudnn_attention_*`) count as attention. The loss's own GEMMs
(torch's, outside the Triton kernels) count as GEMMs. DeepSpeed's ZeRO step on torch's AdamW
has no kernel named apart: the optimizer's kernels count as elementwise.
"""
import re
from collections import defaultdict
from typing import Callable, Dict, List, Tuple

KINDS: Tuple[Tuple[str, str], ...] = (
    ("communication", r"nccl"),
    ("input transfer", r"memcpy htod"),
    ("attention", r"flash|fmha|sdpa|attention"),
    ("contrastive loss", r"_similarity_lse_kernel|_grad_panel_kernel|_siglip_tile_kernel"),
    ("GEMMs", r"gemm|nvjet|cutlass|xmma|wgmma|splitk"),
    ("optimizer", r"multi_tensor|foreach|adam"),
    ("other copies", r"memcpy|memset"),
    ("norms and elementwise", r""),
)
_PATTERNS = [(kind, re.compile(pattern)) for kind, pattern in KINDS]


def kind_of(kernel_name: str) -> str:
    name = kernel_name.lower()
    return next(kind for kind, pattern in _PATTERNS if pattern.search(name))


TOP_KERNELS = 25


def kernel_table(kernels: List[Tuple[str, float]], wall_s: float) -> Dict:
    """(name, seconds) of every kernel of one step -> seconds and share of the step per kind,
    the GPU's idle time (the step's wall time less its busy time, kernels summed: a
    transfer on a side stream that overlaps compute makes this an underestimate), the
    attention kernels that ran (the backend), and the TOP_KERNELS names that took the most
    time (where a kind's seconds go: which norm or fused kernel to work on next)."""
    seconds: Dict[str, float] = defaultdict(float)
    by_name: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0])
    attention = set()
    for name, s in kernels:
        kind = kind_of(name)
        seconds[kind] += s
        by_name[name][0] += s
        by_name[name][1] += 1
        if kind == "attention":
            attention.add(name[:80])
    busy = sum(seconds.values())
    rows = {kind: {"s": seconds.get(kind, 0.0), "share": seconds.get(kind, 0.0) / wall_s} for kind, _ in KINDS}
    rows["GPU idle"] = {"s": max(wall_s - busy, 0.0), "share": max(wall_s - busy, 0.0) / wall_s}
    top = sorted(by_name.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    return {"wall_s": wall_s, "kernels": len(kernels), "kinds": rows, "attention_kernels": sorted(attention),
            "top_kernels": [{"name": name[:120], "kind": kind_of(name), "s": s, "calls": calls}
                            for name, (s, calls) in top]}


def profile_step(step: Callable[[], object]) -> Dict:
    """Run `step()` once under torch.profiler (CUDA activity) and tabulate its kernels."""
    import time
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [(e.name, e.time_range.elapsed_us() * 1e-6) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    return kernel_table(kernels, wall)


def format_table(table: Dict) -> str:
    lines = [f"  {'kind':24} {'s':>8} {'share':>7}"]
    for kind, row in table["kinds"].items():
        lines.append(f"  {kind:24} {row['s']:8.2f} {100 * row['share']:6.1f}%")
    lines.append(f"  step {table['wall_s']:.2f} s, {table['kernels']} kernels; attention: "
                 f"{', '.join(table['attention_kernels'][:3]) or 'none'}")
    return "\n".join(lines)
