"""The towers' footprint on the GPU, which the engine states for the planner: parameters,
FLOPs and saved activations per sample of a CLIP model, from its open_clip config.

Only what the planner needs (plan/ composes it with data/footprint.py's costs and
engine/step.py's passes), computed from the JSON config without building the model (a
ViT-L-14 would take seconds and 1.7 GB): open_clip's VisionTransformer and TextTransformer
towers. Other towers (timm, Hugging Face, ResNet) are refused by name rather than guessed.

Activations are counted tensor by tensor: what autograd saves for the backward in one
open_clip ResidualAttentionBlock (batch-first nn.MultiheadAttention, or the engine's packed form
of it, engine/towers.py, which saves the same tensors; both call
F.scaled_dot_product_attention: flash attention for the image tower, memory-efficient
attention for the causally masked text tower; neither stores the s x s scores) and no
dropout. Per token, in the compute dtype: the block input x (ln_1's), ln_1's output (the
qkv projection's input), q, k and v (one buffer), the attention output (out_proj's input),
x after the first residual (ln_2's), ln_2's output (c_fc's input), c_fc's output (GELU's)
and GELU's output (c_proj's): 8 h + 2 m values (16 h at mlp_ratio 4). In fp32: the two
LayerNorms' mean and rstd (16 B) and the attention's log-sum-exp per head (4 a B). QuickGELU
saves its sigmoid too (+ m), each LayerScale its input (+ h). Per tower: ln_pre's and
ln_post's inputs and, with token pooling, ln_post's output (the pooled row is a view of it,
and the projection's matmul saves it); the text tower ln_final's input; the chunk's images
in the compute dtype (the patch embedding's input). This is Korthikanti et al.'s 34 s h
bytes per layer without the dropout masks and the a s^2 scores term (their eq. 2 assumes
unfused attention). The counts are checked against autograd's saved tensors on the CPU
(tests/plan/test_plan_memory.py); ACTIVATION_CALIBRATION scales them to a GPU measurement (the
backward's transient buffers, allocator rounding).
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ..resources import read_json

# Saved per token of one layer (module docstring): values of width h and m in the compute dtype,
# and fp32 bytes: the LayerNorms' mean and rstd, per head the attention's log-sum-exp
# (memory-efficient attention pads it to 32 tokens: ignored).
LAYER_VALUES_H, LAYER_VALUES_M = 8, 2
NORM_STAT_BYTES = 2 * 2 * 4
LSE_BYTES_PER_HEAD = 4

# Measured activation bytes over the counted ones, per (model, grad_checkpointing):
# calibration/activations.json, refitted by `python -m infcl_ds.plan.calibrate --write` (docs/planner.md).
_ACTIVATIONS = read_json("calibration", "activations.json")
_FITS = {(fit["model"], fit["grad_checkpointing"]): fit for fit in _ACTIVATIONS["fits"]}
ACTIVATION_CALIBRATION: Dict[Tuple[str, bool], float] = {key: fit["factor"] for key, fit in _FITS.items()}
# Any other model, or checkpointing on: the default model's factor, transferred, not measured.
_DEFAULT_FIT = _FITS[(_ACTIVATIONS["default_model"], False)]
DEFAULT_ACTIVATION_CALIBRATION, CALIBRATION_SOURCE = _DEFAULT_FIT["factor"], _DEFAULT_FIT["source"]


class UnmodelledModelError(ValueError):
    """A model config whose towers are not modelled here (ResNet, timm or Hugging Face towers,
    keys the formulas do not cover) or that open_clip does not know; the message names the
    model and why. The planner refuses it as a PlanError, the message prefixed with "plan: "."""


def activation_calibration(name: str, checkpointing: bool) -> Tuple[float, bool]:
    """(factor, measured): the fitted factor for this model and checkpointing setting, else
    the transferred default."""
    factor = ACTIVATION_CALIBRATION.get((name, checkpointing))
    return (factor, True) if factor is not None else (DEFAULT_ACTIVATION_CALIBRATION, False)


# Config keys whose architectural effect the formulas below cover. Anything else changes the
# parameter count or the activations in ways not modelled (e.g. timm/HF towers, attentional
# pooling, patch dropout), and is refused.
_VISION_KEYS = {"image_size", "layers", "width", "head_width", "mlp_ratio", "patch_size", "ls_init_value",
                "pool_type", "act_kwargs", "norm_kwargs"}
_TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "ls_init_value",
              "pool_type", "act_kwargs", "norm_kwargs", "hf_tokenizer_name", "tokenizer_kwargs"}
_TOP_KEYS = {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "custom_text"}


@dataclass(frozen=True)
class Tower:
    """One transformer tower: the image ViT (tokens = patches + class token) or the text
    transformer (tokens = context length)."""
    layers: int
    width: int
    heads: int
    mlp_width: int
    tokens: int
    params: int                 # every parameter of the tower, its projection included
    extra_flops: int            # per sample, outside the layers: patch embedding, projection
    extra_values: int = 1       # saved s x h tensors outside the layers (final norms' in/outputs)
    layer_scale: bool = False
    quick_gelu: bool = False

    def forward_flops(self) -> int:
        """Per sample: 2 FLOPs per multiply-add of every linear layer on every token, plus the
        two attention products (QK^T and PV, 2*s*s*h multiply-adds per layer)."""
        s, h, m = self.tokens, self.width, self.mlp_width
        per_layer = 2 * s * (4 * h * h + 2 * h * m) + 4 * s * s * h
        return self.layers * per_layer + self.extra_flops

    def layer_activation_bytes(self, elem: int, stat_bytes: int = 4) -> int:
        """One layer's saved activations per sample (module docstring): ``elem`` bytes per
        value, ``stat_bytes`` per LayerNorm statistic (fp32 on CUDA; the input's dtype on CPU)."""
        s, h, m, a = self.tokens, self.width, self.mlp_width, self.heads
        values = (LAYER_VALUES_H * h + LAYER_VALUES_M * m + (m if self.quick_gelu else 0)
                  + (2 * h if self.layer_scale else 0))
        return s * (values * elem + NORM_STAT_BYTES * stat_bytes // 4 + LSE_BYTES_PER_HEAD * a)


@dataclass(frozen=True)
class ModelEstimate:
    name: str
    embed_dim: int
    image_size: int
    context_length: int
    image: Tower
    text: Tower

    @property
    def params(self) -> int:
        return self.image.params + self.text.params + 1  # + logit_scale

    def forward_flops(self) -> int:
        """Forward FLOPs of one image-text pair."""
        return self.image.forward_flops() + self.text.forward_flops()

    def counted_activation_bytes(self, elem: int, checkpointing: bool, stat_bytes: int = 4) -> int:
        """Saved activations of one sample through both towers, as counted (module docstring):
        every layer's, or with checkpointing every layer's input plus one layer recomputed at
        a time; and outside the layers the final norms' tensors and the images in the compute
        dtype (the patch embedding's saved input; the uint8 copy is freed by then)."""
        towers = (self.image, self.text)
        if checkpointing:
            per_sample = (sum(t.layers * t.tokens * t.width * elem for t in towers)
                          + max(t.layer_activation_bytes(elem, stat_bytes) for t in towers))
        else:
            per_sample = sum(t.layers * t.layer_activation_bytes(elem, stat_bytes) for t in towers)
        per_sample += sum(t.extra_values * t.tokens * t.width * elem for t in towers)
        return per_sample + 3 * self.image_size ** 2 * elem

    def activation_bytes(self, chunk: int, elem: int, checkpointing: bool) -> float:
        """Activations of one chunk at the peak of its backward: the counted bytes times the
        calibration factor (ACTIVATION_CALIBRATION)."""
        factor, _ = activation_calibration(self.name, checkpointing)
        return chunk * self.counted_activation_bytes(elem, checkpointing) * factor


def _check_keys(where: str, cfg: dict, allowed: set, name: str) -> None:
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise UnmodelledModelError(f"model {name}: {where} sets {', '.join(unknown)}, which the planner does not "
                               "model (it estimates open_clip ViT image towers and transformer text towers)")


def _tower(cfg: dict, layers: int, width: int, quick_gelu: bool, outside_params: int, **fields) -> Tower:
    """A tower of ``layers`` layers and ``outside_params`` other parameters. Per layer: ln_1, the
    qkv and out projections with biases, ln_2, the two MLP linears with biases, and two
    layer-scale vectors when the config sets ls_init_value."""
    mlp = int(width * cfg.get("mlp_ratio", 4.0))
    layer_scale = cfg.get("ls_init_value") is not None
    per_layer = 4 * width * width + 2 * width * mlp + 9 * width + mlp + (2 * width if layer_scale else 0)
    return Tower(layers=layers, width=width, mlp_width=mlp, params=outside_params + layers * per_layer,
                 layer_scale=layer_scale, quick_gelu=quick_gelu, **fields)


def vision_tower(cfg: dict, embed_dim: int, name: str, quick_gelu: bool = False) -> Tower:
    _check_keys("vision_cfg", cfg, _VISION_KEYS, name)
    layers, width = cfg.get("layers", 12), cfg.get("width", 768)
    if not isinstance(layers, int):
        raise UnmodelledModelError(f"model {name}: a ResNet image tower (layers={layers}) is not modelled")
    image_size, patch = cfg.get("image_size", 224), cfg.get("patch_size", 16)
    if not isinstance(image_size, int):
        raise UnmodelledModelError(f"model {name}: non-square image_size {image_size} is not modelled")
    patches = (image_size // patch) ** 2
    tokens = patches + 1
    outside = (3 * patch * patch * width     # conv1, no bias
               + width + tokens * width       # class and positional embeddings
               + 2 * width + 2 * width        # ln_pre, ln_post
               + width * embed_dim)           # proj
    # ln_pre's and ln_post's inputs; with token pooling (the default) or none, ln_post's
    # output too: the pooled row is a view of it, saved by the projection's matmul.
    extra = 3 if cfg.get("pool_type", "tok") in ("tok", "none") else 2
    return _tower(cfg, layers, width, quick_gelu, outside, heads=width // cfg.get("head_width", 64), tokens=tokens,
                  extra_flops=2 * patches * 3 * patch * patch * width + 2 * width * embed_dim, extra_values=extra)


def text_tower(cfg: dict, embed_dim: int, name: str, quick_gelu: bool = False) -> Tower:
    _check_keys("text_cfg", cfg, _TEXT_KEYS, name)
    layers, width = cfg.get("layers", 12), cfg.get("width", 512)
    context, vocab = cfg.get("context_length", 77), cfg.get("vocab_size", 49408)
    outside = (vocab * width + context * width  # token and positional embeddings
               + 2 * width                       # ln_final
               + width * embed_dim)              # text_projection
    # ln_final's input; with first/last-token pooling (a view) or none, its output too.
    extra = 2 if cfg.get("pool_type", "argmax") in ("first", "last", "none") else 1
    return _tower(cfg, layers, width, quick_gelu, outside, heads=cfg.get("heads", 8), tokens=context,
                  extra_flops=2 * width * embed_dim, extra_values=extra)


def estimate_model(name: str, cfg: Optional[dict] = None) -> ModelEstimate:
    """The estimate for open_clip model ``name`` (its config read from open_clip, the project's
    tiny models included, unless given). Raises UnmodelledModelError for a config it does not
    model."""
    if cfg is None:
        import open_clip
        from ..models import register_tiny_configs
        register_tiny_configs()
        cfg = open_clip.get_model_config(name)
        if cfg is None:
            raise UnmodelledModelError(f"open_clip has no model config named {name!r}")
    _check_keys("the config", cfg, _TOP_KEYS, name)
    embed_dim = cfg["embed_dim"]
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    quick = bool(cfg.get("quick_gelu", False))
    return ModelEstimate(name=name, embed_dim=embed_dim, image_size=vision.get("image_size", 224),
                         context_length=text.get("context_length", 77),
                         image=vision_tower(vision, embed_dim, name, quick),
                         text=text_tower(text, embed_dim, name, quick))
