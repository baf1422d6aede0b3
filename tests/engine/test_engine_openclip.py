"""The chunked engine on a real open_clip model (``infcl-tiny``) on 2 gloo ranks equals a
single-process, unchunked, plain-PyTorch step on the whole global batch (full-logit loss):
full gradients (safe_get_full_grad) and the parameters after 2 SGD steps to 1e-5 relative,
for ZeRO 0, 2 and 3. ZeRO-3 is the point: open_clip uses parameters outside any submodule's
forward, and nn.MultiheadAttention reads ``out_proj.weight`` without calling ``out_proj``.
The ZeRO-0 case has the model return a dict (open_clip's ``output_dict``)."""
import math

import pytest
import torch

from reference import full_logits_loss, reference_steps
from devices import exact_loss
from dist_utils import run_ranks

pytestmark = pytest.mark.gpu

GLOBAL, LOCAL, CHUNK, LR = 12, 6, 2, 0.1
IMAGE, CONTEXT, VOCAB = 16, 16, 49408  # infcl-tiny's config


def _model():
    from infcl_ds.models import create_model
    return create_model("infcl-tiny", seed=0)


def batch():
    """Random images and token ids, each text ending in the EOT id (the largest) at a varying
    position, so open_clip's argmax pooling picks a real end-of-text token."""
    g = torch.Generator().manual_seed(5)
    images = torch.randn(GLOBAL, 3, IMAGE, IMAGE, generator=g)
    texts = torch.randint(1, VOCAB - 1, (GLOBAL, CONTEXT), generator=g)
    for row in range(GLOBAL):
        end = 3 + row % (CONTEXT - 3)
        texts[row, end] = VOCAB - 1
        texts[row, end + 1:] = 0
    return images, texts


def _config(stage):
    # Persistence off: ZeRO-3 would otherwise keep every parameter under 1e5 elements (all of
    # this model's but the token embedding) whole after its first use, unlike real sizes.
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    return {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True}


def _engine_run(rank, world, stage, output_dict):
    """Gradients of one chunked step, then the parameters after 2 SGD steps."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    images, texts = batch()
    local = (images[rank * LOCAL:(rank + 1) * LOCAL], texts[rank * LOCAL:(rank + 1) * LOCAL])
    model = _model()
    model.output_dict = output_dict
    step = ContrastiveEngine.create(model, _config(stage), EngineSettings(CHUNK), loss_fn=exact_loss(),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=LR))
    out = {"loss": step.forward_backward(*local).item()}
    out["grads"] = {n: safe_get_full_grad(p).clone() for n, p in step.model.named_parameters()}
    step.deepspeed.step()
    step._clamp_logit_scale(math.log(100.0))
    step.train_step(*local)
    out["sgd"] = {}
    for n, p in step.model.named_parameters():
        master = safe_get_full_fp32_param(p)  # None without a ZeRO optimizer: the parameter is it
        out["sgd"][n] = (master if master is not None else p.detach()).clone()
    return out


def reference_run():
    """The same, unchunked, in one process, with the full-logit loss on open_clip's
    normalised features."""
    images, texts = batch()

    def loss_of(model):
        fi, ft, scale = model(images, texts)
        return full_logits_loss(fi, ft, scale)

    model = _model()
    loss = loss_of(model)
    loss.backward()
    out = {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
    out["sgd"] = reference_steps(_model(), loss_of, torch.optim.SGD, LR, 2)
    return out


def _rel(got, want):
    got = got.reshape(want.shape).double()  # logit_scale: [1] inside DeepSpeed
    return ((got - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("stage,output_dict", [(0, True), (2, False), (3, False)])
def test_chunked_openclip_steps_equal_plain_steps(stage, output_dict):
    ref = reference_run()
    results = run_ranks(_engine_run, 2, stage, output_dict)
    for rank in range(2):
        assert abs(results[rank]["loss"] - ref["loss"]) < 1e-5 * abs(ref["loss"])
        for what in ("grads", "sgd"):
            assert results[rank][what].keys() == ref[what].keys()
            for name, want in ref[what].items():
                err = _rel(results[rank][what][name], want)
                assert err < 1e-5, (stage, rank, what, name, err)
