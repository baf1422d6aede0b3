"""benchmarks/proc_cpu.py: which threads of a trainer keep the host busy."""
import os
import threading
import time

import psutil

from benchmarks.proc_cpu import busiest_threads, children_cpu_s, thread_cpu_s


def test_busiest_threads_sums_a_pool_by_name_and_drops_idle_threads():
    before = {1: ("python", 10.0), 2: ("python", 5.0), 3: ("NCCL proxy", 0.0), 4: ("idle", 3.0)}
    after = {1: ("python", 11.0), 2: ("python", 5.5), 3: ("NCCL proxy", 0.4), 4: ("idle", 3.01),
             5: ("new", 0.3)}  # a thread started between the readings counts from zero
    assert busiest_threads(before, after, 2.0) == ["python x 2:0.75", "NCCL proxy:0.20"]
    assert busiest_threads(before, after, 2.0, top=1) == ["python x 2:0.75"]
    assert busiest_threads(before, after, 0.0) == []


def test_thread_cpu_s_sees_a_spinning_thread_of_this_process():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))
    thread = threading.Thread(target=spin)
    thread.start()
    try:
        before = thread_cpu_s(os.getpid())
        time.sleep(0.5)
        after = thread_cpu_s(os.getpid())
    finally:
        stop.set()
        thread.join()
    assert os.getpid() in after  # the main thread's tid is the pid
    used = {tid: after[tid][1] - before.get(tid, ("", 0.0))[1] for tid in after}
    assert max(used.values()) >= 0.1  # the spinning thread, GIL shared with nothing busy
    assert thread_cpu_s(2 ** 22 + 12345) == {}  # no such process
    assert children_cpu_s(psutil, os.getpid()) >= 0.0
