"""Time and peak memory per phase of an engine step (encode, loss, re-encode, optimizer step).

Off by default: measuring needs a device synchronisation at every phase boundary. The
benchmark turns it on to report where a step's time and memory go. The trainer asks only for
the phases' times (`events`): CUDA events at the boundaries, read after the step, no
synchronisation and no peak reset; on a CPU rank, the host's clock.
"""
import time
from contextlib import contextmanager
from typing import Dict

import torch


class PhaseMeter:
    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.events = False  # times only, without synchronising (see times())
        self.last: Dict[str, Dict[str, float]] = {}
        self._marks: Dict[str, tuple] = {}

    @contextmanager
    def __call__(self, name: str):
        if self.events and not self.enabled:
            start = _mark()
            yield
            self._marks[name] = (start, _mark())
            return
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

    def times(self) -> Dict[str, float]:
        """With `events`: seconds of each phase of the last step (on CUDA, the device's stream
        from the phase's first to its last work, waits for the host included), read once the
        step's work is done; then forgotten."""
        out = {}
        for name, (start, end) in self._marks.items():
            if isinstance(start, float):
                out[name] = end - start
            else:
                end.synchronize()
                out[name] = start.elapsed_time(end) / 1e3
        self._marks = {}
        return out


def _mark():
    """A point in time: a CUDA event on the current stream, or the host's clock without CUDA."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()
