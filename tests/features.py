"""Random features for the tests, on the test device (the float64 references they are checked
against are tests/reference.py's, shared with the benchmarks' self-checks)."""
import torch
import torch.nn.functional as F

from devices import DEVICE


def random_features(n, d, dtype, seed, normalise=True):
    """The same values on every device (drawn on the CPU), on the test device (devices.py)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, device="cpu")
    if normalise:
        x = F.normalize(x, dim=1)
    return x.to(DEVICE, dtype)
