"""A chunked engine step on 2 gloo ranks equals a single-process, unchunked, plain-PyTorch
step on the whole global batch (full-logit loss): full gradients (safe_get_full_grad) to
1e-5 relative, and the parameters after 3 SGD steps, for ZeRO 0-3 in fp32."""
import math

import pytest
import torch

from dist_utils import run_ranks
from reference import full_logits_loss

GLOBAL, LOCAL, CHUNK = 14, 7, 3


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.visual = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 16))
        self.text = torch.nn.Linear(10, 16)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(10.0)))

    def encode_image(self, x):
        return self.visual(x)

    def encode_text(self, t):
        return self.text(t)


def batch():
    g = torch.Generator().manual_seed(5)
    return torch.randn(GLOBAL, 12, generator=g), torch.randn(GLOBAL, 10, generator=g)


def reference_grads():
    import torch.nn.functional as F
    model = Tiny()
    images, texts = batch()
    fi = F.normalize(model.encode_image(images), dim=-1)
    ft = F.normalize(model.encode_text(texts), dim=-1)
    full_logits_loss(fi, ft, model.logit_scale.exp()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _engine_grads(rank, world, stage):
    from deepspeed.utils import safe_get_full_grad

    from infcl_ds.engine import ContrastiveEngine
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, CHUNK, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    engine = step.engine
    images, texts = batch()
    lo = rank * LOCAL
    loss = step.backward(images[lo:lo + LOCAL], texts[lo:lo + LOCAL])
    return {"loss": loss.item(), "grads": {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_chunked_step_equals_plain_step(stage):
    ref = reference_grads()
    results = run_ranks(_engine_grads, 2, stage)
    for rank in range(2):
        for name, g in ref.items():
            got = results[rank]["grads"][name].reshape(g.shape)  # logit_scale: [1] inside DeepSpeed
            err = ((got.double() - g.double()).norm() / g.double().norm()).item()
            assert err < 1e-5, (stage, rank, name, err)


def reference_params_after_sgd(steps=3, lr=0.5):
    import torch.nn.functional as F
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    images, texts = batch()
    for _ in range(steps):
        opt.zero_grad()
        fi = F.normalize(model.encode_image(images), dim=-1)
        ft = F.normalize(model.encode_text(texts), dim=-1)
        full_logits_loss(fi, ft, model.logit_scale.exp()).backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(max=math.log(100.0))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _engine_params_after_sgd(rank, world, stage, steps=3, lr=0.5):
    from deepspeed.utils import safe_get_full_fp32_param

    from infcl_ds.engine import ContrastiveEngine
    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, CHUNK, optimizer=torch.optim.SGD(model.parameters(), lr=lr))
    images, texts = batch()
    lo = rank * LOCAL
    for _ in range(steps):
        step.train_step(images[lo:lo + LOCAL], texts[lo:lo + LOCAL])
    full = {n: safe_get_full_fp32_param(p) for n, p in step.engine.module.named_parameters()}
    # ZeRO 0 keeps no separate master copy: the parameter is it.
    return {n: (v if v is not None else p.detach()).clone()
            for (n, v), p in zip(full.items(), step.engine.module.parameters())}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_three_sgd_steps_equal_plain_steps(stage):
    ref = reference_params_after_sgd()
    results = run_ranks(_engine_params_after_sgd, 2, stage)
    for rank in range(2):
        for name, p in ref.items():
            got = results[rank][name].reshape(p.shape)
            err = ((got.double() - p.double()).norm() / p.double().norm()).item()
            assert err < 1e-5, (stage, rank, name, err)


class TinyWithDropout(Tiny):
    def __init__(self):
        super().__init__()
        self.visual = torch.nn.Sequential(self.visual[0], torch.nn.Dropout(0.5), *self.visual[1:])


def _dropout_replay(rank, world, replay):
    import infcl_ds.engine.step as step_module
    from infcl_ds.engine import ContrastiveEngine
    if not replay:  # break the replay: every chunk re-encodes with fresh randomness
        step_module._set_rng_state = lambda state, device: None
    model = TinyWithDropout()
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, CHUNK, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    verify_replay=True)
    images, texts = batch()
    try:
        step.backward(images[rank * LOCAL:(rank + 1) * LOCAL], texts[rank * LOCAL:(rank + 1) * LOCAL])
    except RuntimeError as err:
        return str(err)
    return "replayed"


def test_dropout_is_replayed_exactly():
    # The re-encoded chunks reproduce the cached features bit for bit with the saved RNG
    # states (so the cached gradients apply), and visibly not without them.
    assert run_ranks(_dropout_replay, 2, True) == {0: "replayed", 1: "replayed"}
    broken = run_ranks(_dropout_replay, 2, False)
    assert all("not replayed" in broken[r] for r in range(2)), broken
