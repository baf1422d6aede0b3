"""engine/towers.py: the packed self-attention is nn.MultiheadAttention's function and the
patch-embedding GEMM the convolution's, on the same parameters (float64: outputs and every
gradient, awkward sizes); the state dict stays, and the calls they do not cover go to the
original modules. Under --gpu on CUDA (cuBLAS, cuDNN and CUDA's attention in float64): the
parameters and inputs are drawn on the CPU, then moved, so both devices see the same values."""
import copy

import pytest
import torch
from torch import nn

from devices import DEVICE
from infcl_ds.engine.towers import PackedSelfAttention, PatchEmbeddingGemm, fast_tower_modules
from infcl_ds.models import create_model

pytestmark = pytest.mark.gpu

TOL = 1e-12  # float64: the two paths differ only in the order of the same operations


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _mask(kind, n, heads, length, gen):
    if kind is None:
        return None
    causal = torch.full((length, length), float("-inf"), dtype=torch.float64).triu(1)
    if kind == "causal":
        return causal
    # (N * H, L, L): a different additive bias for every sample and head
    return causal + torch.randn(n * heads, length, length, dtype=torch.float64, generator=gen)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("mask", [None, "causal", "per_head"])
@pytest.mark.parametrize("n,length,width,heads", [(1, 1, 8, 2), (3, 7, 12, 3), (2, 77, 40, 5)])
def test_packed_attention_matches_multihead_attention(batch_first, mask, n, length, width, heads):
    gen = torch.Generator().manual_seed(n * 1000 + length)
    torch.manual_seed(length)
    reference = nn.MultiheadAttention(width, heads, batch_first=batch_first).double()
    with torch.no_grad():  # MHA starts with zero biases: make them matter
        reference.in_proj_bias.normal_(generator=gen)
        reference.out_proj.bias.normal_(generator=gen)
    reference.to(DEVICE)
    packed = copy.deepcopy(reference)
    assert fast_tower_modules(packed) == {"attention": 1, "patch_embedding": 0, "mlp_epilogue": 0}
    assert type(packed) is PackedSelfAttention
    shape = (n, length, width) if batch_first else (length, n, width)
    x = torch.randn(shape, dtype=torch.float64, generator=gen).to(DEVICE)
    attn_mask = _mask(mask, n, heads, length, gen)
    attn_mask = None if attn_mask is None else attn_mask.to(DEVICE)
    dy = torch.randn(shape, dtype=torch.float64, generator=gen).to(DEVICE)
    results = []
    for module in (reference, packed):
        xi = x.clone().requires_grad_()
        out, weights = module(xi, xi, xi, need_weights=False, attn_mask=attn_mask)
        assert weights is None and out.shape == shape
        (out * dy).sum().backward()
        results.append((out.detach(), xi.grad, {k: p.grad for k, p in module.named_parameters()}))
    (out_r, gx_r, gp_r), (out_p, gx_p, gp_p) = results
    assert _rel(out_p, out_r) < TOL
    assert _rel(gx_p, gx_r) < TOL
    assert gp_p.keys() == gp_r.keys()
    for name in gp_r:
        assert _rel(gp_p[name], gp_r[name]) < TOL, name


def test_uncovered_calls_go_to_multihead_attention():
    """Cross attention, attention weights and boolean masks: nn.MultiheadAttention's own path."""
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(16, 4, batch_first=True).double().to(DEVICE)
    packed = copy.deepcopy(reference)
    fast_tower_modules(packed)
    q, kv = (torch.randn(2, n, 16, dtype=torch.float64).to(DEVICE) for n in (5, 9))
    bool_mask = torch.ones(5, 5, dtype=torch.bool, device=DEVICE).triu(1)
    for args, kwargs in (((q, kv, kv), {}), ((q, q, q), {"need_weights": True}),
                         ((q, q, q), {"need_weights": False, "attn_mask": bool_mask})):
        want, got = reference(*args, **kwargs), packed(*args, **kwargs)
        assert torch.equal(got[0], want[0])
        assert (got[1] is None) == (want[1] is None)


def test_only_plain_self_attention_modules_are_packed():
    plain = nn.MultiheadAttention(8, 2)
    extra_kv = nn.MultiheadAttention(8, 2, add_bias_kv=True)
    zero_attn = nn.MultiheadAttention(8, 2, add_zero_attn=True)
    separate = nn.MultiheadAttention(8, 2, kdim=4, vdim=4)
    model = nn.ModuleList([plain, extra_kv, zero_attn, separate])
    assert fast_tower_modules(model)["attention"] == 1
    assert [type(m) for m in model] == [PackedSelfAttention] + [nn.MultiheadAttention] * 3
    assert fast_tower_modules(model)["attention"] == 0  # already packed: nothing more changes


def test_packed_open_clip_model_keeps_its_state_dict_and_function():
    """Both towers of an open_clip model (the text tower with its causal mask), float64."""
    reference = create_model("infcl-tiny", seed=0).double().to(DEVICE)
    packed = copy.deepcopy(reference)
    # one vision and one text block (attention, MLP); the vision tower's patch embedding
    assert fast_tower_modules(packed) == {"attention": 2, "patch_embedding": 1, "mlp_epilogue": 2}
    assert list(packed.state_dict()) == list(reference.state_dict())
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(3, 3, 16, 16, dtype=torch.float64, generator=gen).to(DEVICE)
    texts = torch.randint(1, 49408, (3, 16), generator=gen).to(DEVICE)
    grads = []
    for model in (reference, packed):
        image, text = model.encode_image(images), model.encode_text(texts)
        (image.square().sum() + (text * torch.arange(32, dtype=torch.float64, device=DEVICE)).sum()).backward()
        grads.append((image.detach(), text.detach(), {k: p.grad for k, p in model.named_parameters()}))
    (ir, tr, gr), (ip, tp, gp) = grads
    assert _rel(ip, ir) < TOL and _rel(tp, tr) < TOL
    for name, want in gr.items():
        if want is not None:
            assert _rel(gp[name], want) < TOL, name


@pytest.mark.parametrize("n,channels,height,width,kernel,bias", [
    (1, 3, 16, 16, 8, False),   # one image, two by two patches
    (3, 3, 37, 29, 7, True),    # sizes that leave rows and columns over, as the convolution drops them
    (2, 5, 30, 30, (5, 3), False),  # a rectangular kernel, 5 channels
])
def test_patch_embedding_gemm_matches_the_convolution(n, channels, height, width, kernel, bias):
    torch.manual_seed(height)
    conv = nn.Conv2d(channels, 12, kernel, stride=kernel, bias=bias).double().to(DEVICE)
    gemm = copy.deepcopy(conv)
    assert fast_tower_modules(gemm) == {"attention": 0, "patch_embedding": 1, "mlp_epilogue": 0} and type(gemm) is PatchEmbeddingGemm
    x = torch.randn(n, channels, height, width, dtype=torch.float64).to(DEVICE).requires_grad_()
    want, got = conv(x), gemm(x)
    assert got.shape == want.shape and _rel(got, want) < TOL
    dy = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((want * dy).sum(), [x, *conv.parameters()]),
                    torch.autograd.grad((got * dy).sum(), [x, *gemm.parameters()])):
        assert _rel(b, a) < TOL


def test_only_non_overlapping_convolutions_become_gemms():
    kinds = nn.ModuleList([nn.Conv2d(3, 4, 4, stride=2), nn.Conv2d(3, 4, 3, stride=3, padding=1),
                           nn.Conv2d(4, 4, 2, stride=2, groups=2), nn.Conv2d(3, 4, 2, stride=2, dilation=2),
                           nn.Conv2d(3, 4, 2, stride=2)])
    assert fast_tower_modules(kinds)["patch_embedding"] == 1
    assert [type(m) for m in kinds] == [nn.Conv2d] * 4 + [PatchEmbeddingGemm]


def test_each_fast_forward_can_be_left_off():
    """launch/probe_towers.py times the two apart: a switched-off kind keeps open_clip's class."""
    model = nn.Sequential(nn.MultiheadAttention(8, 2, batch_first=True), nn.Conv2d(3, 8, 4, stride=4))
    model.append(_mlp(8, 32))
    assert fast_tower_modules(model, attention=False, mlp_epilogue=False) == {
        "attention": 0, "patch_embedding": 1, "mlp_epilogue": 0}
    assert type(model[0]) is nn.MultiheadAttention and type(model[1]) is PatchEmbeddingGemm
    assert type(model[2]) is nn.Sequential
    assert fast_tower_modules(model, patch_embedding=False) == {"attention": 1, "patch_embedding": 0, "mlp_epilogue": 1}
    assert type(model[0]) is PackedSelfAttention


def _mlp(width, hidden, act=nn.GELU):
    from collections import OrderedDict
    return nn.Sequential(OrderedDict([("c_fc", nn.Linear(width, hidden)), ("gelu", act()),
                                      ("c_proj", nn.Linear(hidden, width))]))


def test_only_open_clip_gelu_mlps_take_the_epilogue():
    """nn.GELU between two plain linear layers; not QuickGELU, not another Sequential."""
    from open_clip.transformer import QuickGELU
    from infcl_ds.engine.towers import EpilogueGeluMlp
    model = nn.ModuleList([_mlp(8, 32), _mlp(8, 32, QuickGELU), nn.Sequential(nn.Linear(8, 8), nn.GELU())])
    assert fast_tower_modules(model, mlp_epilogue=False)["mlp_epilogue"] == 0
    assert fast_tower_modules(model)["mlp_epilogue"] == 1
    assert [type(m) for m in model] == [EpilogueGeluMlp, nn.Sequential, nn.Sequential]
    assert fast_tower_modules(model, mlp_epilogue=True)["mlp_epilogue"] == 0


@pytest.mark.parametrize("rows,width,hidden", [(1, 8, 24), (7, 40, 160), (3 * 77, 64, 256)])
def test_mlp_epilogue_is_the_mlp_within_bf16_rounding(monkeypatch, rows, width, hidden):
    """Calls with grad, or in float64, are the module's own (exact, gradients and all). A bf16
    no-grad call on CUDA is cuBLASLt's GEMM with the tanh GELU in its epilogue: as close to the
    float64 erf MLP as the plain bf16 MLP is (bf16 rounding, not the approximation, dominates)."""
    from infcl_ds.engine import towers
    gen = torch.Generator().manual_seed(rows)
    torch.manual_seed(rows)
    reference = _mlp(width, hidden).double()
    fast = copy.deepcopy(reference)
    fast_tower_modules(fast, mlp_epilogue=True)
    reference.to(DEVICE), fast.to(DEVICE)
    x = torch.randn(2, rows, width, dtype=torch.float64, generator=gen).to(DEVICE)
    calls = []
    op = towers.linear_gelu_tanh
    monkeypatch.setattr(towers, "linear_gelu_tanh", lambda *a: calls.append(1) or op(*a))

    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_r, out_f = reference(xr), fast(xf)
    dy = torch.randn(out_r.shape, dtype=torch.float64, generator=gen).to(DEVICE)
    (out_r * dy).sum().backward(), (out_f * dy).sum().backward()
    assert _rel(out_f, out_r) < TOL and _rel(xf.grad, xr.grad) < TOL
    for (name, p_f), p_r in zip(fast.named_parameters(), reference.parameters()):
        assert _rel(p_f.grad, p_r.grad) < TOL, name
    with torch.no_grad():
        assert _rel(fast(x), reference(x)) < TOL
        assert not calls  # float64 and calls with grad: never the epilogue

        plain, fused = copy.deepcopy(reference).bfloat16(), fast.bfloat16()
        xb = x.bfloat16()
        err_plain, err_fused = _rel(plain(xb).double(), out_r), _rel(fused(xb).double(), out_r)
    assert len(calls) == (1 if DEVICE.type == "cuda" else 0)
    assert err_fused < 2 * err_plain + 1e-3, (err_fused, err_plain)
    assert err_plain < 2e-2


@pytest.mark.parametrize("setting", [None, "false"])
def test_recipe_key_gelu_epilogue_reaches_the_engine(monkeypatch, setting):
    """model.gelu_epilogue (default true) is what ContrastiveEngine.create is given."""
    from infcl_ds.config import load_recipe
    from infcl_ds.engine.step import ContrastiveEngine
    from infcl_ds.training.build import build_engine
    seen = {}

    class Stop(Exception):
        pass

    def create(cls, model, ds_config, settings, **kwargs):
        seen["settings"] = settings
        raise Stop  # what is given is all this test needs: no DeepSpeed set-up

    monkeypatch.setattr(ContrastiveEngine, "create", classmethod(create))
    recipe = load_recipe("ds_configs/recipes/tiny-cpu.yaml", ["batch.global=8", "batch.chunk=8", "model.compile=false",
                                                             *([f"model.gelu_epilogue={setting}"] if setting else [])])
    with pytest.raises(Stop):
        build_engine(recipe, 1, torch.device("cpu"))
    assert seen["settings"].gelu_epilogue is (setting is None)
