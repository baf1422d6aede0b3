"""engine/float8.py (`model.float8`): which layers become float8, that parameters, state dict and
optimizer are untouched, the numbers against bf16's, an engine step, and the refusals.

On the CPU the float8 layers run through torchao's emulation (`emulate`: the same casts and scales,
a float32 GEMM); under --gpu on CUDA with float8 tensor cores, the real float8 GEMMs. Tolerance
against the bf16 towers: float8 e4m3 keeps 3 mantissa bits, so each product's inputs carry ~3%
rounding; a 1-layer tower's features then differ by ~3% relative and its weight gradients by ~5%
(measured on the CPU, emulated: 3.3% and 5.5%), and more
than 20% would mean a wrong scale, a transposed operand or a missed cast."""
import pytest
import torch

from devices import DEVICE, GPU

pytest.importorskip("torchao.float8", reason="model.float8 needs torchao (requirements/constraints.txt pins it)")

from infcl_ds.engine.float8 import FLOAT8_CAPABILITY, float8_linears, float8_unavailable  # noqa: E402
from infcl_ds.models import create_model  # noqa: E402

pytestmark = pytest.mark.gpu

SETTING = True if GPU else "emulate"


def needs_float8_gemms():
    if GPU and torch.cuda.get_device_capability() < FLOAT8_CAPABILITY:
        pytest.skip("this GPU has no float8 tensor cores")


def tiny(seed=0):
    return create_model("infcl-tiny", seed=seed).to(DEVICE)


def test_the_towers_linear_layers_are_converted_and_nothing_else():
    model = tiny()
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    before = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    converted = float8_linears(model, emulate=True)
    # infcl-tiny: one block per tower, each with out_proj, c_fc and c_proj (sides 32/128: multiples of 16)
    assert sorted(converted) == sorted(linears) and len(converted) == 6, converted
    assert all(type(model.get_submodule(name)).__name__ == "Float8Linear" for name in converted)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)  # the same Parameters
    assert list(model.state_dict()) == keys


def test_the_packed_qkv_projection_is_float8_on_the_same_parameters():
    """engine/towers.py's packed attention computes QKV from two Parameters, not an nn.Linear: its
    float8 layer is built on those Parameters and kept out of the module tree."""
    from infcl_ds.engine.towers import fast_tower_modules
    model = tiny()
    fast_tower_modules(model)
    before, keys = dict(model.named_parameters()), list(model.state_dict())
    converted = float8_linears(model, emulate=True)
    attention = model.visual.transformer.resblocks[0].attn
    assert "visual.transformer.resblocks.0.attn.in_proj" in converted and len(converted) == 8, converted
    projection = attention.in_proj_module
    assert type(projection).__name__ == "Float8Linear"
    assert projection.weight is attention.in_proj_weight and projection.bias is attention.in_proj_bias
    assert dict(model.named_parameters()) == before and list(model.state_dict()) == keys  # nothing registered twice
    x = torch.randn(2, 5, attention.embed_dim, device=DEVICE)
    with torch.no_grad():
        emulated = projection(x)
        exact = torch.nn.functional.linear(x, attention.in_proj_weight, attention.in_proj_bias)
    assert 1e-4 < ((emulated - exact).norm() / exact.norm()).item() < 0.1  # float8's rounding, not another function
    # The attention's forward runs it: float8's rounding against the bf16 projection, and the
    # gradient reaches the attention's own weight.
    attention.in_proj_weight.grad = None
    out_float8, _ = attention(x, x, x, need_weights=False)
    out_float8.float().square().sum().backward()
    assert attention.in_proj_weight.grad is not None and attention.in_proj_weight.grad.abs().sum() > 0
    attention.__dict__["in_proj_module"] = None
    with torch.no_grad():
        out_exact, _ = attention(x, x, x, need_weights=False)
    attention.__dict__["in_proj_module"] = projection
    assert 1e-4 < ((out_float8.detach() - out_exact).norm() / out_exact.norm()).item() < 0.1
    assert float8_linears(model, emulate=True) == []  # converted once: nothing the second time


def test_layers_with_unaligned_sides_stay_and_a_model_with_none_is_refused():
    class Towers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 20))
            self.text = torch.nn.Linear(24, 16)
    model = Towers()
    assert float8_linears(model, emulate=True) == ["visual.0"]
    assert type(model.visual[1]) is torch.nn.Linear and type(model.text) is torch.nn.Linear
    with pytest.raises(ValueError, match="model.float8: .* no nn.Linear layer"):
        float8_linears(torch.nn.Sequential(torch.nn.Linear(4, 4)), emulate=True)


def test_float8_features_and_gradients_within_its_rounding_of_bf16s():
    needs_float8_gemms()
    images = torch.randn(48, 3, 16, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)
    texts = torch.randint(1, 49000, (48, 16), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    # Features are normalised: a loss of fixed random directions (not of their norms) has gradients.
    gi, gt = (torch.randn(48, 32, generator=torch.Generator().manual_seed(s)).to(DEVICE) for s in (3, 4))
    results = []
    for float8 in (False, True):
        model = tiny().to(torch.bfloat16)
        if float8:
            float8_linears(model, emulate=SETTING == "emulate")
        fi, ft, _ = model(images, texts)
        ((fi.float() * gi).sum() + (ft.float() * gt).sum()).backward()
        results.append((torch.cat([fi, ft], 1).float(), model.visual.transformer.resblocks[0].mlp.c_fc.weight.grad.float()))
    (f_bf16, g_bf16), (f_8, g_8) = results
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert 1e-4 < rel(f_8, f_bf16) < 0.2, rel(f_8, f_bf16)  # above zero: float8 really ran
    assert rel(g_8, g_bf16) < 0.2, rel(g_8, g_bf16)


def test_refusals_name_the_key_and_the_reason():
    from infcl_ds.config import RecipeError, load_recipe
    assert float8_unavailable(False, torch.device("cpu")) is None
    assert float8_unavailable("emulate", torch.device("cpu")) is None
    assert "needs a CUDA GPU with float8 tensor cores" in float8_unavailable(True, torch.device("cpu"))
    with pytest.raises(RecipeError, match="model.float8=True is not supported with zero.stage=3"):
        load_recipe(None, ["model.float8=true", "zero.stage=3"])
    with pytest.raises(RecipeError, match="model.float8"):
        load_recipe(None, ["model.float8=fp8"])
    assert load_recipe(None, ["model.float8=emulate"]).model.float8 == "emulate"
    assert load_recipe(None, []).model.float8 is False


def _float8_step(rank, world, setting):
    from infcl_ds.config import load_recipe
    from infcl_ds.training.build import build_engine
    recipe = load_recipe("ds_configs/recipes/tiny-cpu.yaml", ["model.name=infcl-tiny", f"model.float8={str(setting).lower()}",
                                                             "batch.global=32", "batch.chunk=16", "model.compile=false",
                                                             # float8's setting on GPUs: bf16 towers
                                                             *(["precision.dtype=bf16"] if GPU else [])])
    engine = build_engine(recipe, world, DEVICE)
    g = torch.Generator().manual_seed(rank)
    images = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=g).float().div(255).to(DEVICE)
    texts = torch.randint(1, 49000, (16, 16), generator=g).to(DEVICE)
    kinds = {type(m).__name__ for m in engine.model.modules()}
    loss = engine.train_step(images, texts)
    return float(loss), "Float8Linear" in kinds


def test_an_engine_step_with_float8_layers_on_two_ranks():
    needs_float8_gemms()
    from dist_utils import run_ranks
    out = run_ranks(_float8_step, 2, SETTING)
    (loss0, kind0), (loss1, kind1) = out[0], out[1]
    assert kind0 and kind1
    assert loss0 == pytest.approx(loss1) and 0 < loss0 < 10  # one global loss, finite


def test_turning_float8_on_or_off_at_a_resume_is_a_trajectory_change():
    """Other numerics mid-run: refused at a resume unless --allow-recipe-change. A checkpoint from
    before the key (no model.float8 in its recipe.yaml) ran without it."""
    from infcl_ds.training.recipe_change import trajectory_changes
    before_the_key = "model:\n  name: infcl-tiny\n"
    assert trajectory_changes(before_the_key, "model:\n  name: infcl-tiny\n  float8: false\n") == []
    assert trajectory_changes(before_the_key, "model:\n  name: infcl-tiny\n  float8: true\n") == \
        ["model.float8: False -> True"]
    assert trajectory_changes("model:\n  float8: emulate\n", "model:\n  float8: false\n") == \
        ["model.float8: 'emulate' -> False"]
