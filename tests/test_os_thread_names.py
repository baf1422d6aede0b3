"""os_thread_names.py: our threads and decode processes carry their names for the system too."""
import os
import threading
from pathlib import Path

import pytest

from encoded_shards import wait_until
from infcl_ds.data.decoding.decode_pool import DecodePool
from infcl_ds.os_thread_names import NamedThread


def system_name(pid: int, tid: int = None) -> str:
    return Path(f"/proc/{pid}/task/{tid or pid}/comm").read_text().strip()


def test_a_named_thread_is_named_for_the_system():
    seen, release = {}, threading.Event()

    def body():
        seen["tid"] = threading.get_native_id()
        release.wait(5)
    thread = NamedThread(target=body, os_name="next-batch", daemon=True)
    thread.start()
    try:
        wait_until(lambda: "tid" in seen)
        assert system_name(os.getpid(), seen["tid"]) == "next-batch"
        assert system_name(os.getpid()) != "next-batch"  # the caller's own name is untouched
    finally:
        release.set()
        thread.join()
    with pytest.raises(ValueError, match="15 bytes"):
        NamedThread(target=body, os_name="a-name-of-twenty-bytes")


def test_decode_processes_and_the_pools_threads_are_told_apart():
    pool = DecodePool(None, workers=2, window_rows=32, image_shape=(3, 4, 4))
    try:
        wait_until(lambda: all(system_name(pid) == "decode-worker" for pid in pool.pids))
        pool._start()  # the dispatcher, as the first announcement starts it
        wait_until(lambda: "decode-pool" in {Path(t, "comm").read_text().strip()
                                             for t in Path(f"/proc/{os.getpid()}/task").iterdir()})
    finally:
        pool.close()
