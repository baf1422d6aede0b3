"""`infcl-ds demo`: the exact loss at a batch whose full logits would not fit, on a CPU.

Checks the tiled loss against full B x B logits at a small batch, then runs forward and
backward at a large one (default 32k) through the chunked CPU path, printing the memory the
full logits would have needed against what the tiled loss holds.
"""
import argparse
import resource
import time

import torch
import torch.nn.functional as F

from .cli_args import ArgumentParser, positive_int
from .losses import contrastive_loss


def main(argv=None):
    p = ArgumentParser(prog="infcl-ds demo", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=positive_int, default=32768,
                   help="the large batch run, beside the memory its full logits would need (default 32768)")
    p.add_argument("--dim", type=positive_int, default=512, help="feature width D (default 512)")
    p.add_argument("--check-batch", type=positive_int, default=2048,
                   help="the batch checked against float64 full logits (default 2048)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    scale = torch.tensor(1 / 0.07, requires_grad=True)

    n, d = args.check_batch, args.dim
    image = F.normalize(torch.randn(n, d, dtype=torch.float64), dim=1).float().requires_grad_()
    text = F.normalize(torch.randn(n, d, dtype=torch.float64), dim=1).float().requires_grad_()
    loss = contrastive_loss(image, text, scale)
    loss.backward()
    i64, t64, s64 = (x.detach().double().requires_grad_() for x in (image, text, scale))
    logits = s64 * i64 @ t64.T
    labels = torch.arange(n)
    ref = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    ref.backward()
    err = ((image.grad.double() - i64.grad).norm() / i64.grad.norm()).item()
    print(f"B={n}: loss {loss.item():.6f} vs float64 full logits {ref.item():.6f}; "
          f"image-gradient relative error {err:.1e}")

    n = args.batch
    image = F.normalize(torch.randn(n, d), dim=1).requires_grad_()
    text = F.normalize(torch.randn(n, d), dim=1).requires_grad_()
    t0 = time.perf_counter()
    loss = contrastive_loss(image, text, scale)
    loss.backward()
    seconds = time.perf_counter() - t0
    full_gib = 3 * n * n * 4 / 2**30  # logits, their softmax and its gradient, fp32
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"B={n}, D={d}: loss {loss.item():.4f}, forward+backward {seconds:.1f} s on {torch.get_num_threads()} CPU threads")
    print(f"  full logits would need ~{full_gib:.0f} GiB; this process peaked at {rss_gib:.1f} GiB resident")
    return 0
