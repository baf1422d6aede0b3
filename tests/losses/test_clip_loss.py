"""infcl_ds.ClipLoss against open_clip's ClipLoss(local_loss=True, gather_with_grad=True) on
gloo ranks: same parameter gradients after DDP-style averaging, and a loss equal to the mean
of open_clip's per-rank losses (relative 1e-5, fp32); inside an OpenCLIP-style torch.distributed
program: quiet, fast and without DeepSpeed. The tests marked gpu also run on CUDA (NCCL ranks,
tests/devices.py); the rest check flags and CPU programs, the same on any machine."""
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from devices import DEVICE
from dist_utils import run_ranks
from benchmarks.common import free_port


def _encoders(seed):
    torch.manual_seed(seed)
    return (torch.nn.Linear(12, 16).to(DEVICE), torch.nn.Linear(10, 16).to(DEVICE),
            torch.nn.Parameter(torch.tensor(2.3, device=DEVICE)))


def _step(rank, world, impl):
    import torch.distributed as torch_dist
    import torch.nn.functional as F

    if impl == "open_clip":
        from open_clip.loss import ClipLoss
        loss_fn = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world)
    else:
        from infcl_ds import ClipLoss
        loss_fn = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world)
    image_enc, text_enc, logit_scale = _encoders(0)
    g = torch.Generator().manual_seed(100 + rank)
    images, texts = (torch.randn(9, n, generator=g).to(DEVICE) for n in (12, 10))
    image_features = F.normalize(image_enc(images), dim=-1)
    text_features = F.normalize(text_enc(texts), dim=-1)
    loss = loss_fn(image_features, text_features, logit_scale.exp())
    loss.backward()
    params = list(image_enc.parameters()) + list(text_enc.parameters()) + [logit_scale]
    grads = []
    for p in params:  # what DDP does: average across ranks
        torch_dist.all_reduce(p.grad)
        grads.append(p.grad / world)
    losses = [torch.zeros((), device=DEVICE) for _ in range(world)]
    torch_dist.all_gather(losses, loss.detach())
    return {"loss": loss.item(), "all_losses": [x.item() for x in losses], "grads": grads}


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 3])
def test_drop_in_for_open_clip(world):
    ours = run_ranks(_step, world, "infcl_ds")
    theirs = run_ranks(_step, world, "open_clip")
    mean_theirs = sum(theirs[0]["all_losses"]) / world
    for rank in range(world):
        assert abs(ours[rank]["loss"] - mean_theirs) <= 1e-5 * abs(mean_theirs)
        for a, b in zip(ours[rank]["grads"], theirs[rank]["grads"]):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a, b)


def test_rejects_horovod_and_a_non_scalar_logit_bias():
    from infcl_ds import ClipLoss
    with pytest.raises(ValueError, match="horovod"):
        ClipLoss(use_horovod=True)
    with pytest.raises(ValueError, match="logit_bias must be a scalar"):
        ClipLoss()(torch.randn(3, 4), torch.randn(3, 4), torch.tensor(1.0), logit_bias=torch.zeros(3))


@pytest.mark.gpu
def test_scalar_logit_bias_cancels_like_open_clips():
    """open_clip adds the bias to every logit; the loss and the features' and scale's
    gradients do not change, and the bias gets open_clip's (zero) gradient."""
    from open_clip.loss import ClipLoss as OpenClipLoss

    from infcl_ds import ClipLoss
    g = torch.Generator().manual_seed(3)
    feats = [torch.randn(7, 5, generator=g).to(DEVICE) for _ in range(2)]
    results = []
    for loss_fn in (ClipLoss(), OpenClipLoss()):
        image, text = (f.clone().requires_grad_() for f in feats)
        scale, bias = (torch.tensor(v, device=DEVICE, requires_grad=True) for v in (3.0, -10.0))
        loss = loss_fn(image, text, scale, logit_bias=bias, output_dict=True)["contrastive_loss"]
        loss.backward()
        results.append((loss.detach(), image.grad, text.grad, scale.grad, bias.grad))
    for ours, theirs in zip(*results):  # fp32; the bias's gradient is 0 up to rounding in open_clip's
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours, theirs)
    assert ClipLoss()(*feats, torch.tensor(3.0, device=DEVICE), logit_bias=-10.0) == results[0][0]


BAD_BIASES = [float("nan"), float("inf"), torch.tensor(float("nan")), torch.tensor([-float("inf")])]


@pytest.mark.gpu
@pytest.mark.parametrize("bias", BAD_BIASES, ids=["nan", "inf", "nan-tensor", "inf-tensor"])
@pytest.mark.parametrize("drop_in", ["ClipLoss", "SigLipLoss"])
def test_a_nan_or_inf_logit_bias_is_refused_unless_check_finite_is_off(drop_in, bias):
    """Though ClipLoss never reads its bias (it cancels), a NaN/Inf one is a bad input like any
    other: a ValueError naming it; check_finite=False skips the check, as for the features."""
    import infcl_ds
    loss_cls = getattr(infcl_ds, drop_in)
    g = torch.Generator().manual_seed(4)
    image, text = (torch.randn(6, 5, generator=g).to(DEVICE) for _ in range(2))
    scale = torch.tensor(3.0, device=DEVICE)
    bias = bias.to(DEVICE) if isinstance(bias, torch.Tensor) else bias
    with pytest.raises(ValueError, match="logit_bias contains NaN or Inf"):
        loss_cls()(image, text, scale, bias)
    unchecked = loss_cls(check_finite=False)(image, text, scale, bias)
    if drop_in == "ClipLoss":  # the bias cancels: the loss without it
        assert unchecked == loss_cls()(image, text, scale)


def _bad_bias_on_one_rank(rank, world):
    """What each drop-in raises when one rank's bias is bad (NaN, or not a scalar for ClipLoss),
    and SigLipLoss's loss when check_finite=False and every rank's bias is NaN."""
    from infcl_ds import ClipLoss, SigLipLoss
    g = torch.Generator().manual_seed(5 + rank)
    image, text = (torch.randn(6, 5, generator=g).to(DEVICE) for _ in range(2))
    scale = torch.tensor(3.0, device=DEVICE)
    out = {}
    for name, loss_fn, bias in (
            ("clip nan", ClipLoss(world_size=world), float("nan") if rank == 1 else -10.0),
            ("clip shape", ClipLoss(world_size=world), torch.zeros(3, device=DEVICE) if rank == 0 else -10.0),
            ("siglip nan", SigLipLoss(world_size=world),
             torch.tensor(float("nan"), device=DEVICE) if rank == 1 else -10.0)):
        try:
            loss_fn(image, text, scale, bias)
            out[name] = "no error"
        except ValueError as err:
            out[name] = str(err)
    out["siglip unchecked"] = SigLipLoss(world_size=world, check_finite=False)(image, text, scale, float("nan")).item()
    return out


@pytest.mark.gpu
def test_a_bad_logit_bias_on_one_rank_raises_on_every_rank():
    results = run_ranks(_bad_bias_on_one_rank, 2)
    for rank in range(2):
        assert "rank 1: logit_bias contains NaN" in results[rank]["clip nan"], results[rank]
        assert "rank 0: logit_bias must be a scalar" in results[rank]["clip shape"], results[rank]
        assert "rank 1: logit_bias contains NaN" in results[rank]["siglip nan"], results[rank]
        # The same NaN on every rank, unchecked: a NaN loss, not a disagreement between ranks.
        assert math.isnan(results[rank]["siglip unchecked"]), results[rank]


def test_keeps_open_clips_attributes_and_get_logits():
    from open_clip.loss import ClipLoss as OpenClipLoss

    from infcl_ds import ClipLoss
    flags = dict(local_loss=True, gather_with_grad=False, cache_labels=True, rank=0, world_size=1, use_horovod=False)
    ours, theirs = ClipLoss(**flags), OpenClipLoss(**flags)
    for name in flags:
        assert getattr(ours, name) == getattr(theirs, name) == flags[name]
    image, text = torch.randn(4, 6), torch.randn(4, 6)
    for a, b in zip(ours.get_logits(image, text, 2.0, logit_bias=1.5), theirs.get_logits(image, text, 2.0, 1.5)):
        assert torch.allclose(a, b)


def _flag_warnings(rank, world):
    import infcl_ds.losses.openclip_dropins as dropins
    from infcl_ds import ClipLoss
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world)
        ClipLoss(rank=rank, world_size=world)   # open_clip's defaults: warned once, on rank 0
        ClipLoss(local_loss=True, rank=rank, world_size=world)
        dropins._warned_flags = False
        ClipLoss(rank=rank, world_size=1)  # one rank: the flags make no difference
    return [str(w.message) for w in caught]


def test_warns_once_on_rank_0_when_flags_differ():
    out = _flag_warnings(0, 2)
    assert len(out) == 1 and "gather_with_grad=True" in out[0] and "'gather_with_grad': False" in out[0], out
    import infcl_ds.losses.openclip_dropins as dropins
    dropins._warned_flags = False
    assert _flag_warnings(1, 2) == []


PROGRAM = Path(__file__).resolve().parents[1] / "openclip_program.py"


def test_inside_an_open_clip_style_program(tmp_path):
    """2 CPU gloo ranks set up by torch.distributed (no DeepSpeed), a model config with
    init_logit_bias, DDP, two SGD steps: the losses equal open_clip's mean local loss and
    the weights after the steps open_clip's (fp32, 1e-5); infcl_ds's first call (forward +
    backward) under 5 s, no warning recorded, nothing on stderr, DeepSpeed never imported.
    The environment is a user's: no TRITON_INTERPRET (the PyTorch path), no DS_ACCELERATOR."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DS_ACCELERATOR")}
    env["PYTHONPATH"] = os.pathsep.join([str(PROGRAM.parents[1])] + [p for p in [env.get("PYTHONPATH")] if p])
    port, world = free_port(), 2
    procs = [subprocess.Popen([sys.executable, "-W", "default", str(PROGRAM), str(rank), str(world), str(port),
                               str(tmp_path / f"{rank}.pt")], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
    outputs = [p.communicate(timeout=240) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank}:\n{out}\n{err}"
        assert out == "" and err == "", f"rank {rank} printed:\n{out}\n{err}"
        result = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        ours, theirs = result["ours"], result["theirs"]
        assert ours["warnings"] == [] and not ours["deepspeed_imported"]
        assert ours["first_call_s"] < 5.0, ours["first_call_s"]
        for a, b in zip(ours["losses"], theirs["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), (ours["losses"], theirs["losses"])
        assert ours["params"]["logit_bias"] == theirs["params"]["logit_bias"] == -10.0
        for name, value in ours["params"].items():
            assert torch.allclose(value, theirs["params"][name], rtol=1e-5, atol=1e-5), name


def test_clip_loss_inside_open_clip_train_matches_its_own(tmp_path):
    """infcl_ds.ClipLoss swapped into OpenCLIP's real trainer (open_clip_train.main, 2 CPU ranks
    under torchrun, --local-loss --gather-with-grad, --accum-freq 2, fp32, a model config with
    init_logit_bias): three steps on real images (the digits) give the losses OpenCLIP's own loss
    gives. OpenCLIP's rank-local losses average to the global loss that ours reports on every rank;
    steps 2 and 3 agree only if the gradients, hence the weights, did."""
    import csv
    import json

    from benchmarks.open_clip_train import open_clip_train_args, run_open_clip_train
    from infcl_ds.data.commands.digits import build_digits
    from openclip_program import CONFIG
    config = json.loads(json.dumps(CONFIG))
    config["vision_cfg"]["image_size"] = 32
    config["text_cfg"].update(vocab_size=49408, context_length=77)  # open_clip's tokenizer's ids
    (tmp_path / "tiny-logit-bias.json").write_text(json.dumps(config))
    build_digits(tmp_path / "digits", image_size=32)
    import tarfile
    rows = []
    with tarfile.open(tmp_path / "digits" / "train" / "shard-000000.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
        for key in sorted({name.split(".")[0] for name in members})[:96]:  # 3 steps of 32
            image = tmp_path / f"{key}.png"
            image.write_bytes(tar.extractfile(members[f"{key}.png"]).read())
            rows.append((str(image), tar.extractfile(members[f"{key}.txt"]).read().decode()))
    with open(tmp_path / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows([("filepath", "title"), *rows])
    argv = open_clip_train_args("tiny-logit-bias", 32, 2, 8, 3, False, "fp32", 1, False,
                                data=["--dataset-type", "csv", "--train-data", str(tmp_path / "train.csv"),
                                      "--csv-separator", ","])
    losses = {}
    for impl, extra in (("open_clip", []), ("infcl_ds", ["--infcl-loss"])):
        record = tmp_path / f"{impl}.json"
        run = run_open_clip_train(2, argv, free_port(), ["--model-config-dir", str(tmp_path),
                                                         "--record-losses", str(record), *extra], timeout_s=300)
        assert len(run["samples_per_s"]) == 3, run  # its log lines: one per step
        losses[impl] = [json.loads(Path(f"{record}.rank{r}").read_text()) for r in range(2)]
    theirs = torch.tensor(losses["open_clip"], dtype=torch.float64).mean(0)  # rank-local -> global
    ours = torch.tensor(losses["infcl_ds"], dtype=torch.float64)
    assert ours.shape == (2, 6)  # 3 steps x 2 accumulation calls, on each rank
    assert torch.equal(ours[0], ours[1])  # the global loss, the same on every rank
    assert len(set(ours[0].tolist())) == 3 and ours[0, 0] > ours[0, -1]  # real data: it learns
    torch.testing.assert_close(ours[0], theirs, rtol=2e-6, atol=0)
