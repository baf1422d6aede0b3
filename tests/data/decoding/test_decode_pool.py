"""The decode pool's own threads (data/decoding/decode_pool.py): a slot released behind a device
copy is freed by the releaser thread once the copy completes, in order, without polling."""
import threading
import time

from encoded_shards import wait_until
from infcl_ds.data.decoding.decode_pool import DecodePool


class CopyEvent:
    """A device copy's event as the pool's releaser sees it: synchronize() returns once done."""

    def __init__(self):
        self.done, self.waited = threading.Event(), threading.Event()

    def synchronize(self):
        self.waited.set()
        self.done.wait()


def test_a_slot_released_behind_a_device_copy_is_freed_when_the_copy_completes():
    """The releaser thread waits for each copy in turn (no polling: it sleeps in synchronize) and
    only then gives the slot back."""
    pool = DecodePool(None, workers=1, window_rows=32, image_shape=(3, 4, 4))
    try:
        first, second = pool._free.popleft(), pool._free.popleft()  # two taken pieces' slots
        copies = [CopyEvent(), CopyEvent()]
        pool._release(first, copies[0])
        pool._release(second, copies[1])
        assert copies[0].waited.wait(5)
        time.sleep(0.1)
        assert first not in pool._free and second not in pool._free
        copies[0].done.set()
        wait_until(lambda: first in pool._free)
        assert second not in pool._free
        copies[1].done.set()
        wait_until(lambda: second in pool._free)
    finally:
        pool.close()


def test_a_window_that_cannot_be_page_locked_is_tried_once_and_said(monkeypatch, capsys):
    """Where CUDA refuses to page-lock the window (a memlock limit), the pool says so once and
    copies from pageable memory; it does not try again at every take."""
    import infcl_ds.data.decoding.decode_pool as decode_pool
    calls = []
    monkeypatch.setattr(decode_pool, "register_pinned", lambda tensor: calls.append(tensor.numel()) or False)
    pool = DecodePool(None, workers=1, window_rows=32, image_shape=(3, 4, 4))
    try:
        for _ in range(3):
            assert pool.take(batch_id=0, lo=0, hi=32, pin=True) is None  # nothing announced
        assert calls == [pool.arena.numel()]
        err = capsys.readouterr().err
        assert err.count("could not be page-locked") == 1 and "memlock" in err
    finally:
        pool.close()


def test_decode_processes_yield_the_cores_to_the_training_process():
    """The workers run at a lower priority than the rank (DECODE_NICENESS): its GPU-driving
    thread is never queued behind a decode."""
    import os
    from infcl_ds.data.decoding.decode_pool import DECODE_NICENESS
    pool = DecodePool(None, workers=2, window_rows=32, image_shape=(3, 4, 4))
    try:
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        wait_until(lambda: all(os.getpriority(os.PRIO_PROCESS, pid) == min(19, ours + DECODE_NICENESS)
                               for pid in pool.pids))
    finally:
        pool.close()
