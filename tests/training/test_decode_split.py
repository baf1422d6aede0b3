"""training/decode_split.py: the share of each chunk that lets `hybrid`'s two decoders finish
together at the rates the run measured, taken by `auto` and said for a share the user set; and
training/metrics.GpuDecodeRate."""
import io

import pytest

from infcl_ds.training.decode_split import SplitWatch, balanced_share, split_advice
from infcl_ds.training.metrics import GpuDecodeRate

# ViT-B-32 at 512k a GPU on 2 x H200 (docs/benchmarks.md): 13 processes at 234 rows/s, busy 68%
# of the step, the GPU decoder at about 2,790 rows/s, share 0.575, 70.9 s of 163.4 waiting.
MEASURED = dict(share=0.575, workers=13, rows_per_process_s=234.0, busy_share=0.68, gpu_rows_per_s=2790.0,
                wait_s=70.9, step_s=163.4)


def test_the_balanced_share_gives_both_decoders_the_same_time():
    share = balanced_share(2790.0, 13, 234.0)
    assert share == pytest.approx(2790 / (2790 + 13 * 234))
    rows = 792_576  # any number of decodes: each decoder's share of them at its rate
    assert share * rows / 2790.0 == pytest.approx((1 - share) * rows / (13 * 234.0))


def test_a_waiting_step_with_idle_processes_names_the_share_that_balances_them():
    line = split_advice(**MEASURED)
    assert "data.gpu_decode_share=0.478" in line and "this run: 0.575" in line
    assert "the GPU decoder's share sets the pace" in line and "busy 68%" in line
    assert "70.9 s of 163.4 s" in line
    slow_processes = split_advice(**{**MEASURED, "share": 0.3})
    assert "the decode processes' share sets the pace" in slow_processes


@pytest.mark.parametrize("change", [
    {"wait_s": 0.04 * 163.4},             # the step hardly waited
    {"share": 0.49},                      # already within 0.03 of the balanced share
    {"share": 0.0}, {"share": 1.0},       # not hybrid: one decoder
    {"share": "auto"},                    # not resolved: no run has it
    {"workers": 0}, {"rows_per_process_s": None}, {"gpu_rows_per_s": None}, {"step_s": 0.0},
])
def test_no_line_where_the_split_is_not_what_the_step_waits_on_or_a_rate_is_missing(change):
    assert split_advice(**{**MEASURED, **change}) is None


class FakeDecoder:
    """ChunkDecoder's side the watch reads: cumulative (rows, busy seconds) of each decoder."""

    def __init__(self, pool=True, lane=True, share=0.575):
        self.pool, self.lane = (object() if pool else None), (object() if lane else None)
        self.gpu_share, self.pids = share, list(range(13))
        self.pool_totals, self.lane_totals = (0, 0.0), (0, 0.0)
        self.moves = []

    @property
    def splits(self):
        return self.pool is not None and self.lane is not None

    def set_gpu_share(self, share):
        self.moves.append(share)
        self.gpu_share = share

    def pool_rate(self):
        return self.pool_totals

    def lane_rate(self):
        return self.lane_totals

    def decode(self, rows, per_process=234.0, gpu=2790.0, share=None, alone=0):
        """A step's decoding: `rows` split at `share` (default: the current one), and `alone` more
        rows the processes decode alone, each decoder at its rate (a process's: rows over its own
        busy seconds)."""
        gpu_rows = round(rows * (self.gpu_share if share is None else share))
        pool_rows = rows - gpu_rows + alone
        done, busy = self.pool_totals
        self.pool_totals = (done + pool_rows, busy + pool_rows / per_process)
        done, busy = self.lane_totals
        self.lane_totals = (done + gpu_rows, busy + gpu_rows / gpu)


STEP = dict(wait_s=70.9, step_s=163.4, gpu_wait_s=60.0)  # the GPU decoder's rows set the pace


def test_a_set_share_gets_the_line_once_from_two_steps_after_the_runs_first():
    out, decoder = io.StringIO(), FakeDecoder()
    watch = SplitWatch(decoder, first_step=10, out=out)  # a run resumed at step 10, its share set
    said = []
    for step in (11, 12, 13, 14):  # 11: the decoders start, the towers compile; 12: one step's rates
        decoder.decode(500_000)
        said.append(watch.step(step, 0.575, **STEP))
    assert said[0] is None and said[1] is None and said[3] is None
    assert "data.gpu_decode_share=0.478" in said[2] and "70.9 s of 163.4 s" not in said[2]
    assert "141.8 s of 326.8 s" in said[2]  # the two steps' wait and time together
    assert out.getvalue().count("decoding:") == 1 and not decoder.moves


def test_auto_moves_every_ranks_split_to_its_own_rates_and_rank_0_says_so():
    out, decoder = io.StringIO(), FakeDecoder(share=0.953)
    watch = SplitWatch(decoder, first_step=0, rebalance=True, out=out)
    quiet_decoder = FakeDecoder(share=0.953)
    quiet = SplitWatch(quiet_decoder, first_step=0, rebalance=True, speaks=False, out=out)
    # ViT-B-32 at 512k a GPU on 4 x H200: 13 processes x 199 rows/s, the GPU decoder 1,500 and then
    # 2,710 rows/s (one step's rate alone moves too much to follow)
    for step, gpu in ((1, 2105.0), (2, 1500.0), (3, 2710.0)):
        for d, w in ((decoder, watch), (quiet_decoder, quiet)):
            d.decode(600_000, per_process=199.0, gpu=gpu)
            line = w.step(step, 0.953, 39.9, 159.8, 35.0)
        if step == 2:
            assert line is None and not decoder.moves
    gpu_rate = 2 * 571_800 / (571_800 / 1500.0 + 571_800 / 2710.0)  # both steps' rows over their busy time
    balanced = gpu_rate / (gpu_rate + 13 * 199.0)
    assert decoder.moves == pytest.approx([balanced], abs=1e-3) and quiet_decoder.moves == decoder.moves
    assert f"data.gpu_decode_share 0.953 -> {balanced:.3f} (auto)" in line and "steps 2-3 waited 79.8 s" in line
    assert out.getvalue().count("decoding:") == 1
    # the next batch was assembled before the move: its step measures the old split again, and nothing moves
    decoder.decode(600_000, per_process=199.0, gpu=1931.0, share=0.953)
    assert watch.step(4, 0.953, 30.0, 150.0, 25.0) is None and len(decoder.moves) == 1
    # the new split's steps: they hardly wait, and the split stays whatever their rates say
    for step in (5, 6):
        decoder.decode(600_000, per_process=400.0, gpu=1931.0)
        assert watch.step(step, decoder.gpu_share, 0.04 * 120.0, 120.0) is None and len(decoder.moves) == 1
    # rates that moved, and waits: the split follows, from two steps of one split
    for step in (7, 8):
        decoder.decode(600_000, per_process=120.0, gpu=1931.0)
        line = watch.step(step, decoder.gpu_share, 20.0, 130.0, 5.0)  # now the processes' rows
    assert line is not None and len(decoder.moves) == 2
    assert decoder.gpu_share == pytest.approx(1931 / (1931 + 13 * 120.0), abs=1e-3)


@pytest.mark.parametrize("decoder", [None, FakeDecoder(pool=False), FakeDecoder(lane=False)])
@pytest.mark.parametrize("rebalance", [False, True])
def test_the_watch_is_silent_without_both_decoders(decoder, rebalance):
    assert SplitWatch(decoder, first_step=0, rebalance=rebalance, out=io.StringIO()).step(5, 0.5, **STEP) is None


def test_the_gpu_decoders_rate_covers_the_rows_since_the_last_reading():
    decoder = FakeDecoder()
    decoder.lane_totals = (100, 0.1)  # before the run's first reading: not counted
    rate = GpuDecodeRate(decoder)
    decoder.lane_totals = (3100, 1.1)
    assert rate.since_last() == pytest.approx(3000.0)
    assert rate.since_last() is None  # nothing decoded since
    assert GpuDecodeRate(None).since_last() is None and GpuDecodeRate(FakeDecoder(lane=False)).since_last() is None


def test_with_chunks_the_processes_decode_alone_the_balance_counts_the_rows_each_decoded():
    """A step whose pool kept chunks between the passes: at share 0.5 the GPU decoded 1,000 rows
    (so 2,000 rows were split), the processes 1,500 (500 of them alone). At 1,000 rows/s each the
    GPU takes 2,500 x 1,000 / (2,000 x 2,000) = 0.625 of the split chunks; the plain ratio would
    say 0.5."""
    assert balanced_share(1000.0, 4, 250.0) == 0.5
    assert balanced_share(1000.0, 4, 250.0, share=0.5, gpu_rows=1000, pool_rows=1500) == pytest.approx(0.625)
    line = split_advice(0.5, 4, 250.0, 0.9, 1000.0, wait_s=10.0, step_s=100.0, gpu_rows=1000, pool_rows=1500)
    assert "data.gpu_decode_share=0.625" in line and "the decode processes' share sets the pace" in line
    decoder = FakeDecoder(share=0.5)
    decoder.pids = list(range(4))
    watch = SplitWatch(decoder, first_step=0, out=io.StringIO())
    for step in (1, 2, 3):  # the rows each decoder decoded reach the advice
        decoder.decode(2000, per_process=250.0, gpu=1000.0, alone=500)
        said = watch.step(step, 0.5, 10.0, 100.0, 2.0)
    assert "data.gpu_decode_share=0.625" in said


def test_a_moved_split_leaves_each_decoder_some_rows_so_its_rate_stays_readable():
    decoder = FakeDecoder(share=0.5)
    watch = SplitWatch(decoder, first_step=0, rebalance=True, out=io.StringIO())
    for step in (1, 2, 3):  # a GPU decoder that hardly decodes: the balance is near 0
        decoder.decode(100_000, per_process=200.0, gpu=10.0)
        watch.step(step, 0.5, 30.0, 100.0, 25.0)
    assert decoder.moves == [0.02]
    for step in (4, 5, 6):  # step 4: the batch assembled before the move; 5-6 read the new split
        decoder.decode(100_000, per_process=200.0, gpu=2000.0, share=0.5 if step == 4 else None)
        watch.step(step, 0.5 if step == 4 else 0.02, 30.0, 100.0, 25.0 if step == 4 else 5.0)
    assert decoder.moves == [0.02, pytest.approx(2000 / (2000 + 13 * 200.0), abs=1e-3)]  # below 0.5, where the GPU held


@pytest.mark.parametrize("rebalance", [False, True])
def test_no_move_where_the_engine_waited_on_the_decoder_the_balance_would_load(rebalance):
    """Idle processes but a step that waited for their rows (their window, not their rate, stopped
    them: the pool's kept chunks are all theirs in the first pass): giving them more of each chunk
    would lengthen the wait, so the split stays and no line advises it."""
    decoder = FakeDecoder(share=0.953)
    watch = SplitWatch(decoder, first_step=0, rebalance=rebalance, out=io.StringIO())
    for step in (1, 2, 3, 4):
        decoder.decode(600_000, per_process=199.0, gpu=2105.0)
        assert watch.step(step, 0.953, 39.9, 159.8, 4.0) is None
    assert not decoder.moves


def test_a_balance_past_a_share_where_the_other_decoder_held_the_steps_moves_halfway():
    """One H200, ViT-B-32 at 131,072: at 0.533 the GPU decoder's rows held the steps and its rate
    read 2,148 rows/s, so the balance said 0.411; at 0.411 the processes' rows held them and the
    GPU decoder read 5,069 rows/s, so the balance said 0.597, past 0.533. The split goes halfway,
    0.472; where the GPU's rows hold it there, halfway back down; then the halves are smaller
    than SHARE_CLOSE_ENOUGH and it stays."""
    decoder = FakeDecoder(share=0.533)
    watch = SplitWatch(decoder, first_step=0, rebalance=True, out=io.StringIO())
    slow, fast = dict(per_process=285.0, gpu=2148.0), dict(per_process=263.0, gpu=5069.0)
    gpu_held, pool_held = dict(wait_s=5.0, step_s=28.0, gpu_wait_s=4.0), dict(wait_s=12.0, step_s=38.0, gpu_wait_s=1.0)

    def three_steps(first, before, rates, waits):
        """Step `first` trains the batch assembled at `before` (the run's first step, or the batch
        in flight at the last move: not read), then two steps at the split in force."""
        decoder.decode(131_072, **rates, share=before)
        watch.step(first, before, **waits)
        for step in (first + 1, first + 2):
            decoder.decode(131_072, **rates)
            line = watch.step(step, decoder.gpu_share, **waits)
        return line

    three_steps(1, 0.533, slow, gpu_held)
    low = decoder.gpu_share
    assert decoder.moves == [pytest.approx(2148.0 / (2148.0 + 13 * 285.0), abs=1e-3)]
    line = three_steps(4, 0.533, fast, pool_held)
    assert 5069.0 / (5069.0 + 13 * 263.0) > 0.533  # the balance alone would overshoot the start
    middle = decoder.gpu_share
    assert middle == pytest.approx((low + 0.533) / 2)
    assert "halfway to 0.533, where the other decoder's rows held the steps, not 0.597" in line
    three_steps(7, low, slow, gpu_held)  # the GPU's rows hold the steps at the middle: halfway down
    lower = decoder.gpu_share
    assert lower == pytest.approx((low + middle) / 2)
    three_steps(10, middle, fast, pool_held)  # halfway up would be less than 0.03: it stays
    assert decoder.gpu_share == lower and len(decoder.moves) == 3
