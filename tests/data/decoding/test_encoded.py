"""Encoded host batches (data/decoding/encoded.py): the shards' bytes held, decoded per chunk in
each pass.

Checked: the pixels equal the decoded host batch's with augmentation on, with and without decode
processes, and a chunk decoded twice is bit-identical; undecodable images are replaced the same
way in both passes and counted once; the GPU and hybrid decoders (run on the CPU here) draw the
same crops; through the engine on 2 gloo ranks both host forms give equal gradients, with the
replay check on. The queues that decode ahead, and their failures: test_decode_queue.py.
"""
import time

import pytest
import torch

from dist_utils import run_ranks
from encoded_shards import (IMAGE_SIZE, SAMPLES, both_passes, chunks_of, first_batch, pool_data, shard,  # noqa: F401
                            tokenizer, write_shard)
from infcl_ds.data import DataError
from infcl_ds.data.decoding.decode_pool import DECODE_PIECE_ROWS
from infcl_ds.data.decoding.encoded import EncodedBatch


@pytest.mark.parametrize("decode_workers", [0, 2])
def test_encoded_pixels_equal_decoded_and_both_passes_agree(shard, tokenizer, decode_workers):
    decoded = first_batch(shard, tokenizer, "decoded")
    encoded = first_batch(shard, tokenizer, "encoded", decode_workers=decode_workers)
    assert isinstance(encoded, EncodedBatch)
    first, second = both_passes(encoded, chunk=DECODE_PIECE_ROWS + 3)  # chunks of 1-2 pieces
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    images = torch.cat([im for im, _ in first])
    texts = torch.cat([tx for _, tx in first])
    want_images, want_texts = decoded.chunk(0, len(decoded), torch.device("cpu"))
    assert torch.equal(images, want_images) and torch.equal(texts, want_texts)
    # ... and the augmentation is on: the crops differ from the unaugmented pipeline's.
    unaugmented = first_batch(shard, tokenizer, "encoded", augment=False)
    assert not torch.equal(encoded.decoded(0, 8)[0], unaugmented.decoded(0, 8)[0])
    # Stored bytes per sample: a fraction of the decoded pixels (3 x 24 x 24 here).
    assert encoded.nbytes < decoded.images.numel() + decoded.texts.numel() * 8


def test_chunks_kept_on_the_device_are_decoded_once(shard, tokenizer):
    """data.keep_decoded_gib: the first pass's chunks within keep_rows serve the second pass
    from the device (the same pixels), the others are decoded again."""
    batch = first_batch(shard, tokenizer, "encoded")
    batch.keep_rows = 20
    decoded = []
    pieces = batch.decoder.pieces
    batch.decoder.pieces = type("Counting", (), {"__getitem__": lambda self, r: decoded.append(r[0]) or pieces[r]})()
    first, second = both_passes(batch, chunk=10)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    assert decoded == [0, 10, 20, 30, 20, 30] and not batch._kept


def test_out_of_order_chunks_decode_in_process_to_the_same_pixels(shard, tokenizer):
    batch = first_batch(shard, tokenizer, "encoded", decode_workers=2)
    batch.announce_passes([chunks_of(batch, 16)] * 2)
    want = batch.chunk(0, 16, torch.device("cpu"))
    again = batch.chunk(8, 24, torch.device("cpu"))  # not the announced order
    assert torch.equal(want[0][8:], again[0][:8])


def test_undecodable_images_are_replaced_alike_in_both_passes(tmp_path, tokenizer):
    corrupt = (3, 4, 35)  # a truncated JPEG, garbage bytes, and one in the last piece
    bad = write_shard(tmp_path / "bad.tar", corrupt=corrupt)
    clean = first_batch(write_shard(tmp_path / "clean.tar"), tokenizer, "decoded")
    batch = first_batch(bad, tokenizer, "encoded", decode_workers=2)
    first, second = both_passes(batch, chunk=10)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    assert batch.decode_skipped == len(corrupt)  # counted once, not once per pass
    images = torch.cat([im for im, _ in first])
    texts = torch.cat([tx for _, tx in first])
    want_images, want_texts = clean.chunk(0, SAMPLES, torch.device("cpu"))
    bad_rows = {row for row, index in enumerate(batch.indices) if index in corrupt}  # rows are shuffled
    for row in range(SAMPLES):
        # A replaced row shows the next decodable row of its piece (here, its chunk of 10),
        # image and caption together.
        piece = range(row - row % 10, row - row % 10 + 10)
        source = row if row not in bad_rows else next(r for r in [*piece[piece.index(row):], *piece]
                                                      if r not in bad_rows)
        assert torch.equal(images[row], want_images[source]) and torch.equal(texts[row], want_texts[source])


def test_torchvision_decoder_in_the_pool_agrees_across_passes_and_with_pil(tmp_path, tokenizer):
    """data.decoder=torchvision: the decode processes use torchvision.io and torch's resize.
    Both passes bit-identical, corrupt rows replaced as PIL's path replaces them, pixels within
    rounding of open_clip's PIL pipeline (same crops), counted once."""
    corrupt = (3, 35)
    bad = write_shard(tmp_path / "bad.tar", corrupt=corrupt)
    pil = first_batch(bad, tokenizer, "encoded", decode_workers=0)
    batch = first_batch(bad, tokenizer, "encoded", decode_workers=2, decoder="torchvision")
    first, second = both_passes(batch, chunk=10)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    assert batch.decode_skipped == len(corrupt)
    want, want_texts = pil.decoded(0, SAMPLES)
    assert torch.equal(torch.cat([tx for _, tx in first]), want_texts)  # the same rows replaced
    diff = (batch.decoded(0, SAMPLES)[0].float() - want.float()).abs()  # out of order: decoded in process
    assert diff.mean() < 1.0 and diff.max() < 64, (diff.mean(), diff.max())


def test_a_resumed_batch_has_the_pixels_of_the_uninterrupted_one(shard, tokenizer):
    chunks = [(0, 7), (7, 14), (14, 20)]

    def second_batch_pixels(resume: bool):
        data = pool_data(shard, tokenizer)
        if resume:
            data.load_state_dict({"epoch": 0, "step": 1, "skipped": 0})
        else:
            batches = iter(data)
            next(batches).announce_passes([chunks, chunks])
        batch = next(batches) if not resume else next(iter(data))
        batch.announce_passes([chunks, chunks])
        return torch.cat([batch.chunk(lo, hi, torch.device("cpu"))[0] for lo, hi in chunks])

    assert torch.equal(second_batch_pixels(False), second_batch_pixels(True))


def test_the_planner_counts_the_decode_window_and_its_processes():
    from infcl_ds.config import load_recipe
    from infcl_ds.data import footprint
    row = 3 * 224 ** 2
    recipe = load_recipe(None, ["model.name=ViT-B-16", "data.decode_workers=14", "data.decode_window_gib=1"])
    rows = 2 ** 30 // row  # 7,133 rows of 224 px in 1 GiB: 223 slots of 32
    assert footprint.decode_pool_bytes(recipe.data, 32768, 224) == 223 * 32 * row + 14 * footprint.DECODE_WORKER_RESERVE
    assert rows == 7133
    # At most two local batches (the furthest the pool decodes ahead), at least two slots per process.
    assert footprint.pool_window_rows(recipe.data, 1000, 224) == 2000
    assert footprint.decode_pool_bytes(recipe.data, 100, 224) == 28 * 32 * row + 14 * footprint.DECODE_WORKER_RESERVE
    # The GPU decoder's window is on the device (data.gpu_decode_window_gib): all of its rows with
    # nvjpeg (and no processes), at most its share of two local batches; none with the CPU decoders.
    assert footprint.device_window_rows(recipe.data, 32768, 224) == 0
    nvjpeg = load_recipe(None, ["model.name=ViT-B-16", "data.decoder=nvjpeg", "data.gpu_decode_window_gib=1"])
    assert footprint.device_window_rows(nvjpeg.data, 32768, 224) == rows and footprint.decode_pool_bytes(nvjpeg.data, 32768, 224) == 0
    assert footprint.device_window_rows(nvjpeg.data, 100, 224) == 200
    hybrid = load_recipe(None, ["model.name=ViT-B-16", "data.decoder=hybrid", "data.gpu_decode_window_gib=1",
                                "data.gpu_decode_share=0.25"])
    assert footprint.device_window_rows(hybrid.data, 32768, 224) == rows
    assert footprint.device_window_rows(hybrid.data, 1000, 224) == 500
    kept = load_recipe(None, ["model.name=ViT-B-16", "data.decoder=nvjpeg", "data.gpu_decode_window_gib=1",
                              "data.keep_decoded_gib=0", "batch.chunk=256"])
    from infcl_ds.plan import memory
    from infcl_ds.engine.tower_footprint import estimate_model
    assert memory.DEVICE_WINDOW in memory.gpu_memory(estimate_model("ViT-B-16"), kept, 1).phases[memory.ENCODER_PASS]
    # An unresolved window is the trainer's to resolve, said in one line naming the key.
    with pytest.raises(DataError, match=r"^data.decode_window_gib=auto is resolved by the trainer"):
        footprint.decode_pool_bytes(load_recipe(None, ["data.decode_workers=2"]).data, 100, 224)


def test_a_piece_with_no_decodable_image_is_a_data_error(tmp_path, tokenizer):
    bad = write_shard(tmp_path / "bad.tar", corrupt=range(SAMPLES))
    batch = first_batch(bad, tokenizer, "encoded", decode_workers=2)
    batch.announce_passes([chunks_of(batch, DECODE_PIECE_ROWS)] * 2)
    with pytest.raises(DataError, match="no image of these"):
        batch.chunk(0, DECODE_PIECE_ROWS, torch.device("cpu"))


# -------------------------------------------------------------------- through the engine

class PixelModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.visual = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * IMAGE_SIZE ** 2, 16))
        self.text = torch.nn.Embedding(49408, 16)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.3))

    def encode_image(self, x):
        return self.visual(x)

    def encode_text(self, t):
        return self.text(t).mean(1)


def _engine_grads(rank, world, shard, host_batch, keep_rows=0):
    from deepspeed.utils import safe_get_full_grad
    from open_clip import get_tokenizer

    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    batch = first_batch(shard, get_tokenizer("ViT-B-32"), host_batch, decode_workers=1,
                        local_batch=SAMPLES // world, rank=rank, world_size=world)
    batch.keep_rows = keep_rows
    config = {"train_micro_batch_size_per_gpu": 6, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    model = PixelModel()
    step = ContrastiveEngine.create(model, config, EngineSettings(6, verify_replay=True),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    loss = step.forward_backward(batch)
    return {"loss": loss.item(),
            "grads": {n: safe_get_full_grad(p).clone() for n, p in step.model.named_parameters()}}


def test_engine_gradients_equal_for_both_host_forms(shard):
    decoded = run_ranks(_engine_grads, 2, shard, "decoded")
    for keep_rows in (0, 12):  # 12: two of the four chunks kept decoded between the passes
        encoded = run_ranks(_engine_grads, 2, shard, "encoded", keep_rows)
        for rank in range(2):
            assert encoded[rank]["loss"] == decoded[rank]["loss"]
            for name, want in decoded[rank]["grads"].items():
                assert torch.equal(encoded[rank]["grads"][name], want), (keep_rows, name)


def test_the_gpu_decoder_draws_the_pil_paths_crops_and_replaces_alike(tmp_path, tokenizer):
    """data.decoder=nvjpeg, run on the CPU here (torchvision's CPU decoder in its place, the same
    batched crops): both passes bit-identical, the crop parameters of the PIL path (the pixels
    differ by decoding and rounding, not by geometry), undecodable images replaced by the same
    rule, counted once."""
    corrupt = (3, 35)
    bad = write_shard(tmp_path / "bad.tar", corrupt=corrupt)
    pil = first_batch(bad, tokenizer, "encoded")
    batch = first_batch(bad, tokenizer, "encoded", decoder="nvjpeg", decode_workers=2)
    assert batch.decoder.pool is None  # no decode processes
    first, second = both_passes(batch, chunk=10)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    assert batch.decode_skipped == len(corrupt)
    want = torch.cat([im for im, _ in both_passes(pil, chunk=10)[0]])  # pieces = chunks of 10, like nvjpeg's
    assert torch.equal(torch.cat([tx for _, tx in first]), torch.cat([tx for _, tx in both_passes(pil, 10)[0]]))
    diff = (torch.cat([im for im, _ in first]).float() - want.float()).abs()
    assert diff.mean() < 1.0 and diff.max() < 64, (diff.mean(), diff.max())


def test_a_hybrid_chunk_is_the_pil_pools_rows_then_the_gpu_decoders(shard, tokenizer):
    """data.decoder=hybrid: each chunk's first rows come from the PIL processes (open_clip's
    pixels exactly), its last gpu_decode_share from the GPU decoder (that decoder's own pixels
    for the same rows), bit-identical in both passes."""
    pil = first_batch(shard, tokenizer, "encoded")
    gpu = first_batch(shard, tokenizer, "encoded", decoder="nvjpeg")
    batch = first_batch(shard, tokenizer, "encoded", decoder="hybrid", decode_workers=2, gpu_decode_share=0.3)
    chunk = 20
    batch.announce_passes([chunks_of(batch, chunk)] * 2)
    first, second = [[batch.decoded(lo, lo + chunk) for lo in range(0, SAMPLES, chunk)] for _ in range(2)]
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    for lo, (images, _) in zip(range(0, SAMPLES, chunk), first):
        pieces, (cut, hi) = batch.decoder.split(lo, lo + chunk)
        assert cut - lo == 14 and pieces == [(lo, cut)]
        assert torch.equal(images[:cut - lo], pil.decoded(lo, cut)[0])
        # Exact on the CPU; on CUDA the batched products may take another cuBLAS algorithm for
        # another group of images, so a value at a half may round the other way.
        same = (images[cut - lo:].float() - gpu.decoded(cut, hi)[0].float()).abs()
        assert same.max() == 0 if not torch.cuda.is_available() else same.max() <= 1
        assert not torch.equal(images[cut - lo:], pil.decoded(cut, hi)[0])  # the decoders do differ


def test_gpu_decoders_are_refused_on_cpu_ranks_and_hybrid_gets_the_planned_share():
    from infcl_ds.config import Recipe
    from infcl_ds.data.footprint import DECODE_RATES_PER_WORKER, gpu_decode_rate
    from infcl_ds.plan.machine import split_cores
    from infcl_ds.plan.auto_values import RankSizes
    from infcl_ds.training.resolve import resolve_recipe
    sizes = RankSizes(80 * 2 ** 30, 1, split_cores(16, 1), 256 * 2 ** 30)
    for decoder in ("nvjpeg", "hybrid"):
        recipe = Recipe.model_validate({"data": {"source": "webdataset", "train": "x", "decoder": decoder}})
        with pytest.raises(DataError, match=f"data.decoder={decoder} decodes on the GPU"):
            resolve_recipe(recipe, 1, torch.device("cpu"), 0)
    recipe = Recipe.model_validate({"data": {"source": "webdataset", "train": "x", "decoder": "hybrid",
                                             "decode_workers": 6}})
    share = resolve_recipe(recipe, 1, torch.device("cuda", 0), 0, sizes).recipe.data.gpu_decode_share
    gpu = gpu_decode_rate("torchvision")
    assert share == pytest.approx(gpu / (gpu + 6 * DECODE_RATES_PER_WORKER["pil"]))
    fixed = Recipe.model_validate({"data": {"source": "webdataset", "train": "x", "decoder": "hybrid",
                                            "gpu_decode_share": 0.25}})
    assert resolve_recipe(fixed, 1, torch.device("cuda", 0), 0, sizes).recipe.data.gpu_decode_share == 0.25

def test_hybrid_chunks_kept_in_the_pools_window_are_the_processes_alone_and_decoded_once(shard, tokenizer):
    """data.decoder=hybrid with data.keep_decoded_host_gib: the chunks the pool keeps between the
    passes are decoded by the PIL processes alone (open_clip's pixels), once; the chunk kept on the
    device and those after the kept ones are split as before; both passes bit-identical."""
    row = 3 * IMAGE_SIZE ** 2
    pil = first_batch(shard, tokenizer, "encoded")
    batch = first_batch(shard, tokenizer, "encoded", decoder="hybrid", decode_workers=2, gpu_decode_share=0.3,
                        keep_decoded_gib=(10 * row + 1) / 2 ** 30, keep_decoded_host_gib=(20 * row + 1) / 2 ** 30)
    assert (batch.keep_rows, batch.host_keep_rows) == (10, 20)  # rows 0-9 on the device, 10-29 in the window
    chunk = 10
    pieces, on_device = batch.decoder.pieces_in([chunks_of(batch, chunk)] * 2, batch.keep_rows, batch.host_keep_rows)
    assert [(lo, hi) for lo, hi in on_device] == [(7, 10), (37, 40), (37, 40)]
    assert [(lo, hi, uses) for lo, hi, uses in pieces] == [(0, 7, 1), (10, 20, 2), (20, 30, 2), (30, 37, 1),
                                                          (30, 37, 1)]
    first, second = both_passes(batch, chunk)
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    for k in (1, 2):  # the window's chunks: PIL's pixels, every row
        assert torch.equal(first[k][0], pil.chunk(10 * k, 10 * k + 10, torch.device("cpu"))[0])
    assert batch.decoder.lane_rate()[0] == 3 + 2 * 3  # the GPU's rows: 7-9 once, 37-39 in both passes
    assert batch.decoder.pool_rate()[0] == 7 + 20 + 2 * 7
    batch.decoder.close()


def test_a_moved_hybrid_split_reaches_only_the_batches_assembled_after_it(shard, tokenizer):
    """ChunkDecoder.set_gpu_share (the trainer's `auto` split, training/decode_split.py): a batch
    assembled before keeps its split in both passes; one assembled after splits at the new share."""
    data = pool_data(shard, tokenizer, local_batch=SAMPLES // 4, decoder="hybrid", gpu_decode_share=0.3)
    batches = iter(data)
    early = next(batches)
    decoder = early.decoder
    decoder.set_gpu_share(0.6)
    next(batches)  # assembled while the first was taken: either share
    late = next(batches)  # assembled after the second was taken, so after the move
    assert (early.gpu_share, late.gpu_share) == (0.3, 0.6)
    chunk = 5
    for batch, gpu_rows in ((early, 2), (late, 3)):  # of each chunk of 5: round(5 x share)
        first, second = both_passes(batch, chunk)
        for (im1, tx1), (im2, tx2) in zip(first, second):
            assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
        _, on_device = decoder._announced[batch.serial]  # what the GPU decoder's queue was given
        assert [hi - lo for lo, hi in on_device] == [gpu_rows] * 2 * (len(batch) // chunk)  # both passes
    with pytest.raises(ValueError, match="from 0 to 1"):
        decoder.set_gpu_share(1.5)
    data.close()
    pil_only = first_batch(shard, tokenizer, "encoded", decode_workers=2)
    with pytest.raises(ValueError, match="only where both decoders run"):
        pil_only.decoder.set_gpu_share(0.5)
    pil_only.decoder.close()


def test_a_split_moved_between_the_passes_leaves_the_batch_at_its_own(shard, tokenizer):
    """A move while a batch is between its passes: its second pass decodes each row with the
    decoder of its first (each decoder's row count says so, the pixels match)."""
    batch = first_batch(shard, tokenizer, "encoded", decoder="hybrid", decode_workers=2, gpu_decode_share=0.3)
    chunk, cpu = 5, torch.device("cpu")
    batch.announce_passes([chunks_of(batch, chunk)] * 2)
    first = [batch.chunk(lo, hi, cpu) for lo, hi in chunks_of(batch, chunk)]
    batch.decoder.set_gpu_share(0.6)
    second = [batch.chunk(lo, hi, cpu) for lo, hi in chunks_of(batch, chunk)]
    for (im1, tx1), (im2, tx2) in zip(first, second):
        assert torch.equal(im1, im2) and torch.equal(tx1, tx2)
    chunks = SAMPLES // chunk
    assert batch.decoder.lane_rate()[0] == 2 * 2 * chunks  # round(5 x 0.3) rows of each chunk, both passes
    assert batch.decoder.pool_rate()[0] == 2 * 3 * chunks
    # the wait for the GPU decoder's rows, counted apart (SplitWatch reads which decoder it waited on)
    take, slow = batch.decoder.take_on_device, 0.02
    batch.decoder.take_on_device = lambda *args: time.sleep(slow) or take(*args)
    before, before_gpu = batch.decode_wait_s, batch.decode_wait_gpu_s
    batch.chunk(0, chunk, cpu)  # a chunk asked for a third time: decoded again, here
    assert batch.decode_wait_gpu_s - before_gpu >= slow and batch.decode_wait_s - before >= slow
    assert batch.decode_wait_gpu_s <= batch.decode_wait_s
    batch.decoder.close()
