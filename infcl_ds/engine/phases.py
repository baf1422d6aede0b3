"""Time and peak memory per phase of an engine step (encode, loss, re-encode, optimizer step).

Off by default: measuring needs a device synchronisation at every phase boundary. The
benchmark turns it on to report where a step's time and memory go.
"""
import time
from contextlib import contextmanager
from typing import Dict

import torch


class PhaseMeter:
    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.last: Dict[str, Dict[str, float]] = {}

    @contextmanager
    def __call__(self, name: str):
        if not self.enabled:
            yield
            return
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize()
        self.last[name] = {"s": time.perf_counter() - start,
                           "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
                           # What the caching allocator held from the device: the peak plus
                           # its rounding and fragmentation.
                           "reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if cuda else None}
