"""A plain torch.distributed program in the style of OpenCLIP's trainer (open_clip_train), run
by tests/losses/test_clip_loss.py once per rank: ``python openclip_program.py RANK WORLD PORT OUT``.

It builds an open_clip model whose config has ``init_logit_bias`` (so the model returns a
``logit_bias`` that the trainer passes to the loss), wraps it in DDP and takes two SGD steps
with ``loss(**model_out, output_dict=True)``, as ``open_clip_train.train.train_one_epoch``
does: once with infcl_ds.ClipLoss, once with open_clip's ClipLoss(local_loss=True,
gather_with_grad=True), from the same weights. infcl_ds's first call runs first, timed, with
every warning recorded. Writes a torch.save'd dict to OUT."""
import json
import logging
import os
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

LOCAL, STEPS = 5, 2
CONFIG = {"embed_dim": 24, "init_logit_bias": -10.0,
          "vision_cfg": {"image_size": 16, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
          "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}}


def model():
    import open_clip
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "tiny-logit-bias.json"), "w") as f:
        json.dump(CONFIG, f)
    open_clip.add_model_config(folder)
    torch.manual_seed(0)
    logging.disable(logging.WARNING)  # open_clip's "No pretrained weights loaded": not ours to judge
    try:
        return open_clip.create_model("tiny-logit-bias", pretrained=None, output_dict=True)
    finally:
        logging.disable(logging.NOTSET)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(LOCAL, 3, 16, 16, generator=g), torch.randint(1, 100, (LOCAL, 8), generator=g)


def train(loss_fn, rank, timed=False):
    ddp = DistributedDataParallel(model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    out = {"losses": []}
    for step in range(STEPS):
        images, texts = batch(rank, step)
        model_out = ddp(images, texts)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = loss_fn(**model_out, output_dict=True)
            total_loss = sum(losses.values())
            total_loss.backward()
        if step == 0 and timed:
            out["first_call_s"] = time.perf_counter() - start
            out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        optimizer.step()
        optimizer.zero_grad()
        # open_clip's per-rank local losses differ; their mean is the global loss.
        value = total_loss.detach().clone()
        dist.all_reduce(value)
        out["losses"].append(value.item() / dist.get_world_size())
    out["params"] = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
    return out


def main(rank, world, port, path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from open_clip.loss import ClipLoss as OpenClipLoss

    from infcl_ds import ClipLoss
    ours = train(ClipLoss(local_loss=True, gather_with_grad=True, cache_labels=True, rank=rank, world_size=world),
                 rank, timed=True)
    theirs = train(OpenClipLoss(local_loss=True, gather_with_grad=True, cache_labels=True, rank=rank,
                                world_size=world), rank)
    ours["deepspeed_imported"] = "deepspeed" in sys.modules
    torch.save({"ours": ours, "theirs": theirs}, path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
