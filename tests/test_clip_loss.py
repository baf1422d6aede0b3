"""infcl_ds.ClipLoss against open_clip's ClipLoss(local_loss=True, gather_with_grad=True) on
gloo ranks: same parameter gradients after DDP-style averaging, and a loss equal to the mean
of open_clip's per-rank losses (relative 1e-5, fp32)."""
import pytest
import torch

from dist_utils import run_ranks


def _encoders(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(12, 16), torch.nn.Linear(10, 16), torch.nn.Parameter(torch.tensor(2.3))


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
    images, texts = torch.randn(9, 12, generator=g), torch.randn(9, 10, generator=g)
    image_features = F.normalize(image_enc(images), dim=-1)
    text_features = F.normalize(text_enc(texts), dim=-1)
    loss = loss_fn(image_features, text_features, logit_scale.exp())
    loss.backward()
    params = list(image_enc.parameters()) + list(text_enc.parameters()) + [logit_scale]
    grads = []
    for p in params:  # what DDP does: average across ranks
        torch_dist.all_reduce(p.grad)
        grads.append(p.grad / world)
    losses = [torch.zeros(()) for _ in range(world)]
    torch_dist.all_gather(losses, loss.detach())
    return {"loss": loss.item(), "all_losses": [x.item() for x in losses], "grads": grads}


@pytest.mark.parametrize("world", [2, 3])
def test_drop_in_for_open_clip(world):
    ours = run_ranks(_step, world, "infcl_ds")
    theirs = run_ranks(_step, world, "open_clip")
    mean_theirs = sum(theirs[0]["all_losses"]) / world
    for rank in range(world):
        assert abs(ours[rank]["loss"] - mean_theirs) <= 1e-5 * abs(mean_theirs)
        for a, b in zip(ours[rank]["grads"], theirs[rank]["grads"]):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a, b)


def test_rejects_horovod_and_logit_bias():
    from infcl_ds import ClipLoss
    with pytest.raises(ValueError, match="horovod"):
        ClipLoss(use_horovod=True)
    with pytest.raises(ValueError, match="logit_bias"):
        ClipLoss()(torch.randn(3, 4), torch.randn(3, 4), torch.tensor(1.0), logit_bias=torch.tensor(0.0))
