"""OpenCLIP's decay rule and CLIP's AdamW defaults, decided on the unwrapped model."""
import math

import torch

from infcl_ds.engine.optim import clip_adamw, clip_param_groups


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.ln_final = torch.nn.LayerNorm(4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.text_projection = torch.nn.Parameter(torch.randn(4, 4))


def test_decay_groups_follow_open_clip():
    m = M()
    no_decay, decay = clip_param_groups(m)
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == {"proj.weight", "text_projection"}
    assert {names[id(p)] for p in no_decay["params"]} == {"proj.bias", "ln_final.weight", "ln_final.bias", "logit_scale"}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.2


def test_clip_adamw_defaults():
    opt = clip_adamw(M(), lr=1e-3)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6
