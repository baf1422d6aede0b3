"""The engine with the sigmoid loss (loss="siglip"): a chunked step on 2 gloo ranks equals a
single-process, unchunked, plain-PyTorch step on the whole global batch with the
textbook sigmoid loss over the B x B logits: full gradients (logit_bias included) to 1e-5
relative and the parameters after 3 SGD steps, for ZeRO 0, 2 and 3; a model whose forward
returns (image, text, scale, bias) like open_clip's SigLIP, and one with encoders only."""
import math

import pytest
import torch
import torch.nn.functional as F

from reference import full_logits_sigmoid_loss, reference_steps
from devices import exact_loss
from dist_utils import run_ranks
from test_engine import Tiny

pytestmark = pytest.mark.gpu

GLOBAL, LOCAL, CHUNK = 14, 7, 3


class TinySigLip(Tiny):
    """test_engine's tiny model with a logit bias (a SigLIP model to the engine)."""

    def __init__(self):
        super().__init__()
        self.logit_bias = torch.nn.Parameter(torch.tensor(-3.0))


class TinySigLipForward(TinySigLip):
    def forward(self, images, texts):
        return (F.normalize(self.encode_image(images), dim=-1), F.normalize(self.encode_text(texts), dim=-1),
                self.logit_scale.exp(), self.logit_bias)


MODELS = {"encoders": TinySigLip, "forward": TinySigLipForward}


def batch():
    g = torch.Generator().manual_seed(5)
    return torch.randn(GLOBAL, 12, generator=g), torch.randn(GLOBAL, 10, generator=g)


def _engine_run(rank, world, stage, kind):
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad

    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    images, texts = batch()
    local = (images[rank * LOCAL:(rank + 1) * LOCAL], texts[rank * LOCAL:(rank + 1) * LOCAL])
    model = MODELS[kind]()
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, EngineSettings(CHUNK, loss="siglip"),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.5), loss_fn=exact_loss("siglip"))
    out = {"loss": step.forward_backward(*local).item()}
    out["grads"] = {n: safe_get_full_grad(p).clone() for n, p in step.model.named_parameters()}
    step.deepspeed.step()
    step._clamp_logit_scale(math.log(100.0))
    for _ in range(2):
        step.train_step(*local)
    out["sgd"] = {}
    for n, p in step.model.named_parameters():
        master = safe_get_full_fp32_param(p)
        out["sgd"][n] = (master if master is not None else p.detach()).clone()
    return out


def reference_run():
    images, texts = batch()

    def loss_of(model):
        return full_logits_sigmoid_loss(F.normalize(model.encode_image(images), dim=-1),
                                        F.normalize(model.encode_text(texts), dim=-1),
                                        model.logit_scale.exp(), model.logit_bias)

    model = TinySigLip()
    loss = loss_of(model)
    loss.backward()
    out = {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
    out["sgd"] = reference_steps(TinySigLip(), loss_of, torch.optim.SGD, 0.5, 3)
    return out


@pytest.mark.parametrize("stage,kind", [(0, "encoders"), (2, "forward"), (3, "encoders"), (3, "forward")])
def test_chunked_siglip_steps_equal_plain_steps(stage, kind):
    ref = reference_run()
    assert ref["grads"]["logit_bias"].abs() > 1e-3  # the bias gradient is exercised
    results = run_ranks(_engine_run, 2, stage, kind)
    for rank in range(2):
        assert abs(results[rank]["loss"] - ref["loss"]) < 1e-5 * abs(ref["loss"])
        for what in ("grads", "sgd"):
            for name, want in ref[what].items():
                got = results[rank][what][name].reshape(want.shape).double()
                err = ((got - want.double()).norm() / want.double().norm()).item()
                assert err < 1e-5, (stage, kind, rank, what, name, err)


def test_loss_and_model_must_agree():
    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    with pytest.raises(ValueError, match="model.loss"):
        ContrastiveEngine.create(TinySigLip(), {}, EngineSettings(CHUNK, loss="clip"))
    plain = TinySigLip()
    plain.logit_bias = None
    with pytest.raises(ValueError, match="needs a model with a logit_bias"):
        ContrastiveEngine.create(plain, {}, EngineSettings(CHUNK, loss="siglip"))


def test_recipe_key_model_loss():
    from infcl_ds.config import RecipeError, load_recipe
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "ds_configs" / "recipes" / "tiny-cpu-siglip.yaml"
    assert load_recipe(path).model.loss == "siglip"
    assert load_recipe(overrides=[]).model.loss == "clip"
    with pytest.raises(RecipeError, match="model.loss must be one of"):
        load_recipe(path, overrides=["model.loss=softmax"])


def test_siglip_models_get_a_bias_and_siglip_init():
    from infcl_ds.models import create_model, loss_of_state_dict
    model = create_model("infcl-tiny", seed=0, loss="siglip")
    assert abs(model.logit_scale.item() - math.log(10)) < 1e-6 and model.logit_bias.item() == -10.0
    assert loss_of_state_dict(model.state_dict()) == "siglip"
    assert create_model("infcl-tiny", seed=0).logit_bias is None
