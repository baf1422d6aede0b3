"""training/metrics.PoolRate: a decode process's own rate and the share of a step the decode
processes spent decoding, from the pool's running totals."""
import time

from infcl_ds.training.metrics import PoolRate


class FakeDecoder:
    def __init__(self, workers: int):
        self.pids = list(range(workers))
        self.totals = (0, 0.0)  # rows decoded, seconds the processes spent decoding

    def pool_rate(self):
        return self.totals


def test_rate_and_busy_share_cover_the_interval_since_the_last_reading():
    decoder = FakeDecoder(workers=2)
    rate = PoolRate(decoder)
    time.sleep(0.2)
    decoder.totals = (400, 0.4)  # both processes busy through about 0.2 s
    assert rate.since_last() == 1000.0
    assert 0.5 < rate.busy_share <= 1.0
    time.sleep(0.2)
    decoder.totals = (410, 0.44)  # 0.04 s of decoding in the next 0.2 s: the processes mostly waited
    assert abs(rate.since_last() - 250.0) < 1e-6
    assert rate.busy_share < 0.2


def test_no_processes_no_figures():
    rate = PoolRate(None)
    assert rate.since_last() is None and rate.busy_share is None
    idle = PoolRate(FakeDecoder(workers=0))
    time.sleep(0.01)
    assert idle.since_last() is None and idle.busy_share is None
