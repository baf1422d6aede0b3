"""Compiled encoders (recipe key `model.compile`): `torch.compile` of the towers, in place.

Eager open_clip towers run their norms, GELUs, bias and residual adds one kernel at a time;
compilation fuses them, as OpenCLIP's own trainer does with `--torchcompile` (docs/benchmarks.md
has both trainers' compiled steps). Each tower is compiled with `nn.Module.compile`, which keeps the module and
its parameters (the state dict's keys, DeepSpeed's hooks and checkpoints are unchanged), with
static shapes: the engine's chunks all have one size, so a step compiles each tower once per
pass kind (no grad, with grad) and once more for a remainder chunk, never after the first step.
`graphs_compiled()` counts the graphs, so a recompilation shows in the step's metrics.

The towers compiled are those of engine/towers.py (packed attention, the patch embedding as a
GEMM), which ContrastiveEngine.create swaps in first: compilation fuses around them.

Not under ZeRO-3 (config/recipe.py's compile_supported, which the recipe, the engine and the planner ask).
A tower must be a module of the model's own class (open_clip's are): torch 2.11 compiles nothing
of a bare torch.nn module (a plain nn.Sequential), whose forward lives in torch itself, and
`graphs_compiled()` then stays 0.
Dropout in a compiled tower draws from the same generator state in both passes, but through
the compiled graph's own random kernels: check such a model with `verify_replay` first.
"""
from typing import List, Optional

import torch

# The towers of open_clip's models: CLIP (visual, transformer), CustomTextCLIP (visual, text).
TOWER_NAMES = ("visual", "transformer", "text")
# The backend model.compile runs (EngineSettings.from_recipe).
COMPILE_BACKEND = "inductor"


def compile_encoders(model: torch.nn.Module, backend: str = COMPILE_BACKEND,
                     options: Optional[dict] = None) -> List[str]:
    """Compile `model`'s towers in place (`options`: the backend's, e.g. inductor's config keys);
    returns their names. ValueError if it has none."""
    towers = [name for name in TOWER_NAMES if isinstance(getattr(model, name, None), torch.nn.Module)]
    if not towers:
        raise ValueError(f"model.compile: {type(model).__name__} has none of the towers {TOWER_NAMES} to compile")
    for name in towers:
        getattr(model, name).compile(backend=backend, dynamic=False, options=options)
    return towers


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process so far."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])
