"""`EngineSettings`: everything `ContrastiveEngine` is told, as one typed object.

Each setting that a recipe key sets takes its default from that key (config/recipe.py owns the
recipe's keys and their defaults; the engine asks, as it asks `compile_supported`), so a default
is stated once for the trainer and for a program that builds the engine itself. The settings
with no recipe key (a debugging aid, the benchmarks' phase timings) default here.

`from_recipe` is the one mapping from recipe keys to settings. It lives beside the fields, not in
training/, so that the field and the key it comes from read side by side; `config` sits beside
the engine in the layers (docs/architecture.md), so the engine may read it, and nothing in
`config` reads the engine.
"""
import dataclasses
from typing import Optional, Union

from ..config.recipe import BatchSection, ModelSection, PrecisionSection, Recipe
from .compile import COMPILE_BACKEND
from .loss_adapter import LossAdapter

# The recipe's defaults, read once for the fields below.
_MODEL, _BATCH, _PRECISION = ModelSection(), BatchSection(), PrecisionSection()


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """chunk_size: samples encoded at once. loss: a name in engine/loss_adapter.py's ADAPTERS or
    a LossAdapter. offload_features: cached features and their gradients wait in pinned host
    memory during the encoder passes (the paper's setting for its largest batches), on the GPU
    only for the loss. grad_accum_fp32: a bf16 model's chunk gradients summed in
    fp32 (engine/grad_sum.py). compile_backend: torch.compile's backend for the towers
    (engine/compile.py), None for eager. float8: the towers' linear layers in float8 (True, or
    "emulate"; engine/float8.py). gelu_epilogue: the no-grad passes' MLPs take c_fc's bias and
    GELU into the GEMM (engine/towers.py). verify_replay: check that each re-encoded chunk
    reproduces its cached features (a mismatch means stale cached gradients). time_phases: time
    and peak memory per phase in ``engine.phases.last`` (a device synchronisation at every
    phase boundary)."""
    chunk_size: int                                          # batch.chunk, resolved to a number
    loss: Union[str, LossAdapter] = _MODEL.loss              # model.loss
    offload_features: bool = _BATCH.offload_features         # batch.offload_features
    grad_accum_fp32: bool = _PRECISION.grad_accum_fp32       # precision.grad_accum_fp32
    compile_backend: Optional[str] = None                    # model.compile, resolved for the device
    float8: Union[bool, str] = _MODEL.float8                 # model.float8
    gelu_epilogue: bool = _MODEL.gelu_epilogue               # model.gelu_epilogue
    verify_replay: bool = False
    time_phases: bool = False

    def __post_init__(self):
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {self.chunk_size!r}")

    @classmethod
    def from_recipe(cls, recipe: Recipe, device_type: str, *, time_phases: bool = False) -> "EngineSettings":
        """The settings of `recipe` for a rank on `device_type` ("cuda", "cpu": whether
        model.compile's auto compiles). batch.chunk must be resolved (training/resolve.py)."""
        if recipe.batch.chunk == "auto":
            raise ValueError("batch.chunk is auto: resolve it for this rank first (training/resolve.py)")
        return cls(chunk_size=recipe.batch.chunk, loss=recipe.model.loss,
                   offload_features=recipe.batch.offload_features,
                   grad_accum_fp32=recipe.precision.grad_accum_fp32,
                   compile_backend=COMPILE_BACKEND if recipe.compiles(device_type) else None,
                   float8=recipe.model.float8, gelu_epilogue=recipe.model.gelu_epilogue, time_phases=time_phases)
