"""plan/overlap.py: the engine's wait for decoded rows in a steady step, against cases worked out
by hand (tests/test_decode_stall.py compares it with a real decode pool)."""
import pytest

from infcl_ds.plan.overlap import (EVENTS_PER_PASS, RATE_MARGIN, Decoder, StepShape, overlap, steady_wait,
                                   tolerance_s, window_needed)


def shape(local=1024, chunk=128, kept=1024, passes=2, encode=1.0, loss=0.0, reencode=3.0):
    return StepShape(local=local, chunk=chunk, kept=kept, passes=passes, encode_s=encode, loss_s=loss,
                     reencode_s=reencode)


def test_decoders_too_slow_for_the_step_wait_the_difference_whatever_the_window():
    """1,024 rows a step at 200/s: 5.12 s of decoding for 4 s of compute; with room to run
    ahead all step long, the engine waits 1.12 s a step, and no window makes it less."""
    step = shape()
    result = overlap(step, [Decoder(200.0, 4096)])
    assert result.bound_s == pytest.approx(1.12) and result.rate_binds
    assert result.wait_s == pytest.approx(1.12, abs=1e-6) and not result.window_binds
    assert result.step_s == pytest.approx(5.12, abs=1e-6)


def test_the_training_process_decoding_waits_for_every_row():
    """No window (no decode processes): every chunk is decoded when the engine asks for it."""
    assert steady_wait(shape(), [Decoder(512.0, 0)]) == pytest.approx(2.0)
    # rows not kept are decoded again in the grad pass
    assert steady_wait(shape(kept=512), [Decoder(512.0, 0)]) == pytest.approx(3.0)
    # one pass over a local batch of one chunk: decoded once
    assert shape(chunk=1024, passes=1).decodes == 1024
    assert steady_wait(shape(chunk=1024, passes=1), [Decoder(512.0, 0)]) == pytest.approx(2.0)


def test_a_window_smaller_than_the_next_first_pass_needs_makes_it_wait():
    """300 rows/s keep up with 1,024 rows in a 4 s step, but pass 1 takes 1,024 rows in 1 s: the
    pool must hold about 1,024 - 300 x 1 rows ahead when the step starts. With 128 it waits
    for most of them; with what window_needed gives, not at all."""
    step = shape()
    small = overlap(step, [Decoder(300.0, 128)])
    assert small.window_binds and not small.rate_binds
    # the first chunk is there, the other 896 rows come at 300/s while 7 chunks compute 7/8 s
    assert small.wait_s == pytest.approx(896 / 300 - 7 / 8, rel=0.02)
    needed = window_needed(step, [Decoder(300.0, 0)])
    assert needed % 32 == 0 and steady_wait(step, [Decoder(300.0, needed)]) <= tolerance_s(step)
    # sized for decoders RATE_MARGIN as fast too: a piece less waits at that rate
    slower = [Decoder(300.0 * RATE_MARGIN, needed - 32)]
    assert steady_wait(step, slower) > steady_wait(step, [Decoder(300.0 * RATE_MARGIN, needed)])
    # the waits fall as the window grows
    waits = [steady_wait(step, [Decoder(300.0, w)]) for w in (64, 256, 512, 768, needed)]
    assert waits == sorted(waits, reverse=True)


def test_two_decoders_split_each_chunk_and_the_slower_one_sets_the_wait():
    """hybrid: the processes' rows and the GPU's, each ahead within its own window."""
    step = shape(kept=0)  # 2,048 rows a step
    both = overlap(step, [Decoder(200.0, 4096, 0.5), Decoder(3000.0, 4096, 0.5)])
    assert both.bound_s == pytest.approx(1024 / 200 - 4.0)
    assert both.wait_s == pytest.approx(both.bound_s, abs=1e-6)
    fast = overlap(step, [Decoder(3000.0, 4096, 0.2), Decoder(3000.0, 4096, 0.8)])
    assert fast.wait_s == 0 and fast.bound_s == 0
    # the GPU's window too small: it binds though its rate would keep up
    narrow = overlap(step, [Decoder(3000.0, 4096, 0.5), Decoder(400.0, 32, 0.5)])
    assert narrow.wait_s > overlap(step, [Decoder(3000.0, 4096, 0.5), Decoder(400.0, 4096, 0.5)]).wait_s


def test_long_passes_are_simulated_in_groups_of_chunks():
    """A million-row pass of chunks of 64 is EVENTS_PER_PASS events, not 16,384; the wait the
    groups give is that of the chunks within a group's compute."""
    big = shape(local=1 << 20, chunk=64, kept=1 << 20, encode=100.0, reencode=300.0)
    assert len(big.events()) == 2 * EVENTS_PER_PASS + 1 and big.decodes == 1 << 20
    exact = shape(local=8192, chunk=64, kept=8192, encode=1.0, reencode=3.0)   # 128 events a pass: exact
    coarse = shape(local=8192, chunk=16, kept=8192, encode=1.0, reencode=3.0)  # 512 chunks: exact too
    for window in (512, 2048, 4096):
        a = steady_wait(exact, [Decoder(2500.0, window)])
        b = steady_wait(coarse, [Decoder(2500.0, window)])
        assert abs(a - b) <= 64 / 8192 * 4.0 + 1e-9


def test_rows_kept_in_the_pools_window_are_decoded_once_and_held_until_the_grad_pass():
    """512 of 1,024 rows kept on the GPU, the other 512 in the pool's window: 1,024 decodes a
    step (not 1,536), and those 512 stay in the window from pass 1 to pass 2, so the window
    must be larger than they are to decode ahead at all."""
    step = shape(kept=512)
    kept_too = StepShape(local=1024, chunk=128, kept=512, passes=2, encode_s=1.0, loss_s=0.0, reencode_s=3.0,
                         host_kept=512)
    assert step.decodes == 1536 and kept_too.decodes == 1024
    only_them = steady_wait(kept_too, [Decoder(300.0, 512 + 32)])
    assert only_them > steady_wait(kept_too, [Decoder(300.0, 4096)]) + 0.5
    needed = window_needed(kept_too, [Decoder(300.0, 0)], floor=512 + 32)
    assert needed > 512 + 32 and steady_wait(kept_too, [Decoder(300.0, needed)]) <= tolerance_s(kept_too)
    # decoding each row once where twice would bind: 1,536 rows at 300/s is 5.12 s for 4 s of compute
    assert overlap(step, [Decoder(300.0, 4096)]).rate_binds and not overlap(kept_too, [Decoder(300.0, 4096)]).rate_binds


@pytest.mark.parametrize("seconds, text", [
    (14.08, "14.1 s"), (1234.5, "1,234.5 s"), (0.9996, "1.0 s"), (0.0421, "42 ms"), (0.00421, "4.2 ms"),
    (0.00996, "10 ms"), (5.9e-5, "59 us"), (8.83e-7, "883 ns"), (3.3e-9, "3.3 ns"), (1e-12, "under 1 ns"),
    (0.0, "0 s"),
])
def test_times_are_printed_in_the_unit_they_reach_never_a_bare_zero(seconds, text):
    """What the planner's report says of a step ("108 ms instead of 59 us", not "0 s instead of 0 s")."""
    from infcl_ds.plan.overlap import seconds_text
    assert seconds_text(seconds) == text


def test_windows_that_bind_only_together_are_grown_together_and_the_planner_says_so(monkeypatch):
    """A hybrid rank's chunk starts once both decoders have its rows: where neither window alone
    shortens the wait, both grow by the same fraction of the way to two steps' decodes, and the
    planner names both sizes in one line; with them the steady step does not wait."""
    import re

    from infcl_ds.config import load_recipe
    from infcl_ds.data import footprint
    from infcl_ds.plan.overlap import windows_needed_together
    from infcl_ds.plan.plan import make_plan
    from infcl_ds.plan.timing import step_decoders
    monkeypatch.setitem(footprint._DECODE_RATES, "nvimgcodec_per_gpu", 3116.4)
    gib = 1 << 30
    recipe = load_recipe("ds_configs/recipes/vit-b16-1m-8gpu.yaml", [
        "model.name=ViT-B-32", "batch.global=2097152", "batch.chunk=auto", "data.decoder=hybrid",
        "data.decode_workers=13", "data.gpu_decode_share=0.585", "data.gpu_jpeg_library=nvimgcodec",
        "data.keep_decoded_gib=auto", "data.decode_window_gib=auto", "data.gpu_decode_window_gib=4",
        "data.keep_decoded_host_gib=0"])  # every row the GPU does not keep decoded in both passes
    plan = make_plan(recipe, 4, int(139.8 * gib), 4, 500 * gib, cores=64)
    shape = plan.decoding.overlap.shape
    decoders = step_decoders(plan.recipe, plan.local_batch, plan.model.image_size, shape.host_kept)
    assert plan.decoding.overlap.window_binds and len(decoders) == 2
    for which, decoder in enumerate(decoders):  # neither alone
        assert window_needed(shape, decoders, which=which, floor=decoder.window) == decoder.window
    rows = windows_needed_together(shape, decoders)
    assert all(r > d.window for r, d in zip(rows, decoders))
    grown = [Decoder(d.rate, r, d.share) for d, r in zip(decoders, rows)]
    assert steady_wait(shape, grown) <= tolerance_s(shape)
    line = next(w for w in plan.unbinding if "together leave" in w)
    row = 3 * plan.model.image_size ** 2
    assert re.search(r"^a window of ([\d.]+) GiB a rank \(data.decode_window_gib; .*\) and a GPU decoder's window "
                     r"of ([\d.]+) GiB \(data.gpu_decode_window_gib; ", line)
    stated = [float(x) for x in re.findall(r"window of ([\d.]+) GiB", line)]
    assert stated == [pytest.approx(r * row / gib, abs=0.05) for r in rows]


def test_a_hybrid_rank_that_gives_the_gpu_no_rows_is_told_of_the_pools_window_only():
    from infcl_ds.config import load_recipe
    from infcl_ds.plan.plan import make_plan
    gib = 1 << 30
    recipe = load_recipe("ds_configs/recipes/vit-b16-1m-8gpu.yaml", [
        "model.name=ViT-B-32", "batch.global=262144", "batch.chunk=1024", "data.decoder=hybrid",
        "data.decode_workers=13", "data.gpu_decode_share=0", "data.decode_window_gib=1",
        "data.keep_decoded_gib=auto", "data.gpu_decode_window_gib=4"])
    plan = make_plan(recipe, 4, int(139.8 * gib), 4, 500 * gib, cores=64)
    windows = [w for w in plan.unbinding if "window of" in w]
    assert windows and all("data.decode_window_gib" in w and "gpu_decode_window_gib" not in w for w in windows)


def test_hybrids_rows_kept_in_the_pools_window_are_the_processes_alone_and_balanced_against_the_gpu():
    """1,024 rows: 256 kept on the GPU, 512 in the pool's window, 256 decoded in both passes:
    1,280 decodes, the window's 512 the processes' alone. At the share that balances both
    decoders over the step, each takes the same seconds; at the rate ratio, the processes bind."""
    from infcl_ds.config.recipe import DataSection
    from infcl_ds.data import footprint
    from infcl_ds.plan.overlap import rate_bound
    step = StepShape(local=1024, chunk=128, kept=256, passes=2, encode_s=1.0, loss_s=0.0, reencode_s=1.0,
                     host_kept=512)
    assert step.decodes == 1280
    cpu, gpu = 300.0, 500.0
    by_rate = gpu / (gpu + cpu)
    # the processes decode 512 + (1 - s) x 768 rows, the GPU s x 768
    assert rate_bound(step, [Decoder(cpu, 4096, 1 - by_rate), Decoder(gpu, 4096, by_rate)]) == pytest.approx(
        (512 + round(768 * (1 - by_rate))) / cpu - 2.0, rel=0.01)
    data = DataSection.model_validate({"source": "webdataset", "train": "x", "decoder": "hybrid",
                                       "decode_workers": 13})
    cpu, gpu = 13 * footprint.DECODE_RATES_PER_WORKER["pil"], footprint.gpu_decode_rate(data.gpu_jpeg_library)
    fewer = StepShape(local=1024, chunk=128, kept=256, passes=2, encode_s=1.0, loss_s=0.0, reencode_s=1.0,
                      host_kept=128)  # 256 + 128 + 2 x 640 = 1,664 decodes, 128 the processes' alone
    share = footprint.hybrid_gpu_share(data, fewer.decodes, fewer.host_kept)
    assert share > footprint.hybrid_gpu_share(data) == pytest.approx(gpu / (gpu + cpu))
    split = fewer.decodes - fewer.host_kept
    assert share * split / gpu == pytest.approx(((1 - share) * split + 128) / cpu)  # both busy alike
    # where the processes' rows alone outlast the GPU's every other row: all of those, no more
    assert footprint.balanced_gpu_share(500.0, 300.0, step.decodes, step.host_kept) == 1.0
