"""The trainer's line a minute on rank 0 during a long step (training/heartbeat.py), with a
short interval: lines while a step runs, none once it ended, the batch's counters in them, and
the batch let go at the step's end."""
import gc
import io
import time
import weakref

from infcl_ds.training.heartbeat import StepHeartbeat, line


class Batch:
    chunks_announced, chunks_taken, decode_wait_s = 512, 37, 80.24


def wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


def test_a_long_step_gets_a_line_each_interval_and_an_ended_one_none():
    out = io.StringIO()
    heartbeat = StepHeartbeat(every_s=0.05, out=out)
    batch = Batch()
    heartbeat.begin(3, 10)  # waiting for its batch
    wait_for(lambda: "waiting for its batch" in out.getvalue())
    heartbeat.batch(batch)
    wait_for(lambda: "chunks taken" in out.getvalue())
    heartbeat.end()  # a line of its step is printed before it returns, or not at all
    lines = out.getvalue().splitlines()
    time.sleep(0.3)
    assert out.getvalue().splitlines() == lines  # nothing after the step
    assert all(text.startswith("step 3/10: ") for text in lines)
    assert lines[0].endswith("s so far, waiting for its batch (the data readers)")
    assert lines[-1].endswith(" s so far, 37 of 512 chunks taken (all passes), 80.2 s waiting for decoded rows")
    ref = weakref.ref(batch)
    del batch
    gc.collect()
    assert ref() is None  # not held past its step
    heartbeat.begin(4, 10, Batch())  # the next step counts its own time
    wait_for(lambda: "step 4/10: 0 s so far" in out.getvalue())
    heartbeat.close()
    assert not heartbeat._thread.is_alive()


def test_a_short_step_prints_nothing_and_a_batch_without_counters_gets_the_time_alone():
    out = io.StringIO()
    heartbeat = StepHeartbeat(every_s=5.0, out=out)
    heartbeat.begin(1, 2, object())
    time.sleep(0.2)
    heartbeat.end()
    heartbeat.close()
    assert out.getvalue() == ""
    assert line(1, 2, object(), time.monotonic() - 61) == "step 1/2: 61 s so far"
