"""Float8 linear layers in the towers (recipe key `model.float8`), with torchao's float8
training: opt-in, not the bf16 towers' numerics.

Why: the towers' GEMMs are most of a compiled step (docs/benchmarks.md, "The towers"), and
Hopper's float8 tensor cores run twice bf16's rate. OpenCLIP's authors trained CLIP ViTs with
int8/float8 linear layers (SwitchBack, "Stable and low-precision training for large-scale
vision-language models"); torchao's float8 training is the maintained implementation of that
approach for PyTorch, composable with torch.compile.

What changes: each `nn.Linear` of the towers whose sides are multiples of 16 (the float8 GEMM's
alignment) becomes torchao's Float8Linear with rowwise scales: the input, the weight and the
output gradient are cast to float8 (e4m3) with one scale per row, each GEMM runs in float8 with
bf16 output, the weights and their gradients stay in the model's dtype. The module class changes,
the parameters do not (the same Parameter objects: the optimizer built before, the state dict,
checkpoints and `infcl-ds export` are unchanged). The packed QKV projection of engine/towers.py's
attention (a quarter of a block's linear FLOPs) is a pair of Parameters of the attention module,
not an nn.Linear: it gets a Float8Linear built on those same Parameters, kept outside the module
tree (`PackedSelfAttention.in_proj_module`), so it is float8 too, on the self-attention calls
PackedSelfAttention covers (a text tower's key-padding or boolean masks go to open_clip's own
forward, in bf16). That layer holds the Parameter objects themselves: whatever replaces them
(`load_state_dict(..., assign=True)`) would leave it on the old ones; nothing here does. Not converted: the patch
embedding, the towers' final projections (Parameters, not layers) and the loss (bf16/fp32 as before).

`model.float8: emulate` runs torchao's emulation (the casts and scales, a float32 GEMM) on any
device: the same numbers' rounding where no float8 GEMM exists (the CPU tests), never faster.
"""
import dataclasses
import types
from typing import List, Union

import torch

from .compile import TOWER_NAMES
from .towers import PackedSelfAttention

# Both sides of a converted layer are multiples of this (float8 GEMMs need 16-byte alignment).
FLOAT8_MULTIPLE = 16
# Float8 GEMMs need Ada or Hopper tensor cores (sm_89 and later): H100, H200, L40S, ...
FLOAT8_CAPABILITY = (8, 9)


def float8_unavailable(setting: Union[bool, str], device: torch.device):
    """Why `model.float8: setting` cannot run on `device` (a message naming the key), or None.
    The same answer on every rank of a uniform job: checked before any collective."""
    if not setting:
        return None
    try:
        import torchao.float8  # noqa: F401
    except ImportError as err:
        return (f"model.float8={setting} needs torchao (pip install 'infcl-ds[float8]', or torchao "
                f"itself): {err}")
    if setting == "emulate":
        return None
    if device.type != "cuda":
        return (f"model.float8=true needs a CUDA GPU with float8 tensor cores (compute capability "
                f"{FLOAT8_CAPABILITY[0]}.{FLOAT8_CAPABILITY[1]}+: H100, H200, L40S); this rank runs on {device.type}. "
                f"Use model.float8: false, or emulate to check its numerics (slow)")
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_CAPABILITY:
        return (f"model.float8=true needs compute capability {FLOAT8_CAPABILITY[0]}.{FLOAT8_CAPABILITY[1]}+ "
                f"(float8 tensor cores); {torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}")
    return None


def _wanted(module: torch.nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear
    return (isinstance(module, torch.nn.Linear) and not isinstance(module, Float8Linear)  # not twice
            and module.in_features % FLOAT8_MULTIPLE == 0 and module.out_features % FLOAT8_MULTIPLE == 0)


def _packed_projection_float8(attention: PackedSelfAttention, config) -> None:
    """The packed QKV projection as a Float8Linear on the attention's own Parameters."""
    from torchao.float8.float8_linear import Float8Linear
    width = attention.embed_dim
    # from_float reads these four and assigns the same Parameter objects to the new layer.
    linear = types.SimpleNamespace(in_features=width, out_features=3 * width, weight=attention.in_proj_weight,
                                   bias=attention.in_proj_bias)
    # Through __dict__: an attribute, not a registered child (no second copy in the state dict).
    attention.__dict__["in_proj_module"] = Float8Linear.from_float(linear, config=config)


def float8_linears(model: torch.nn.Module, emulate: bool = False, recipe: str = "rowwise") -> List[str]:
    """Convert the towers' eligible nn.Linear layers to torchao's Float8Linear (rowwise scales),
    and the packed QKV projections of engine/towers.py's attention, in place; the converted
    layers' names (`....in_proj` for a projection; none the second time; ValueError if the towers
    have no layer float8 can take). `recipe`:
    torchao's scaling recipe (launch/probe_towers.py also times "tensorwise": one scale a tensor)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    converted = []
    for tower in (name for name in TOWER_NAMES if isinstance(getattr(model, name, None), torch.nn.Module)):
        names = [f"{tower}.{name}" for name, module in getattr(model, tower).named_modules() if _wanted(module)]
        if names:
            convert_to_float8_training(getattr(model, tower), config=config,
                                       module_filter_fn=lambda module, fqn: _wanted(module))
            converted += names
        for name, module in getattr(model, tower).named_modules():
            if (isinstance(module, PackedSelfAttention) and module.in_proj_module is None
                    and module.embed_dim % FLOAT8_MULTIPLE == 0):
                _packed_projection_float8(module, config)
                converted.append(f"{tower}.{name}.in_proj")
    from torchao.float8.float8_linear import Float8Linear
    if not converted and not any(isinstance(m, Float8Linear) for m in model.modules()):  # none: not a second call
        raise ValueError(f"model.float8: {type(model).__name__} has no nn.Linear layer in its towers "
                         f"{TOWER_NAMES} with both sides multiples of {FLOAT8_MULTIPLE}")
    return converted
