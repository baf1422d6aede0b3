"""The decode pool's own threads (data/decode_pool.py): a slot released behind a device copy is
freed by the releaser thread once the copy completes, in order, without polling."""
import threading
import time

from encoded_shards import wait_until
from infcl_ds.data.decode_pool import DecodePool


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
