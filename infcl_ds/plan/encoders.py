"""Parameters, FLOPs and activation memory of a CLIP model, from its open_clip config.

Only what the planner needs, computed from the JSON config without building the model (a
ViT-L-14 would take seconds and 1.7 GB): open_clip's VisionTransformer and TextTransformer
towers. Other towers (timm, Hugging Face, ResNet) are refused by name rather than guessed.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", eq. 2): one transformer layer stores s*b*h*(34 + 5*a*s/h) bytes with
16-bit activations (sequence s, batch b, width h, heads a). That formula assumes unfused
attention (the 5*a*s/h term stores the a*s*s scores) and dropout masks; open_clip runs
PyTorch's fused attention and has no dropout, so it is an upper bound until calibrated
against GPU measurements in ACTIVATION_CALIBRATION.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .errors import PlanError

# Korthikanti et al.: bytes per token per unit width of one layer (16-bit activations), and
# the coefficient of the attention-score term a*s/h.
LAYER_ACT_BYTES_PER_TOKEN_WIDTH = 34
ATTN_SCORE_BYTES = 5
# With activation checkpointing each layer keeps only its input: s*h values in 16 bit.
CHECKPOINT_BYTES_PER_TOKEN_WIDTH = 2

# Measured / estimated activation bytes of one chunk, per (model, grad_checkpointing); None
# until measured on a GPU (e.g. torch.cuda.max_memory_allocated around one chunk's
# forward + backward, minus what was allocated before). The estimate is multiplied by it.
ACTIVATION_CALIBRATION: Dict[Tuple[str, bool], Optional[float]] = {
    ("ViT-B-16", False): None,
    ("ViT-B-16", True): None,
    ("ViT-L-14", False): None,
    ("ViT-L-14", True): None,
}

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

    def forward_flops(self) -> int:
        """Per sample: 2 FLOPs per multiply-add of every linear layer on every token, plus the
        two attention products (QK^T and PV, 2*s*s*h multiply-adds per layer)."""
        s, h, m = self.tokens, self.width, self.mlp_width
        per_layer = 2 * s * (4 * h * h + 2 * h * m) + 4 * s * s * h
        return self.layers * per_layer + self.extra_flops

    def layer_activation_bytes(self, elem: int) -> float:
        """One layer's stored activations per sample (Korthikanti et al.), scaled from 16 bit
        to ``elem`` bytes per value."""
        s, h, a = self.tokens, self.width, self.heads
        return s * h * (LAYER_ACT_BYTES_PER_TOKEN_WIDTH + ATTN_SCORE_BYTES * a * s / h) * elem / 2

    def checkpoint_bytes(self, elem: int) -> float:
        """Per sample, with activation checkpointing: every layer's input."""
        return self.layers * CHECKPOINT_BYTES_PER_TOKEN_WIDTH * self.tokens * self.width * elem / 2


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

    def host_input_bytes(self) -> int:
        """One sample as the data pipeline holds it: uint8 image [3, H, W] + int64 tokens."""
        return 3 * self.image_size ** 2 + 8 * self.context_length

    def activation_bytes(self, chunk: int, elem: int, checkpointing: bool) -> float:
        """Stored activations of one chunk through both towers (the engine's with-grad pass
        encodes a chunk's images and texts, then backpropagates both): every layer's, or with
        checkpointing every layer's input plus one layer recomputed at a time. The chunk's
        images also stay on the device as uint8 and in the compute dtype (the patch
        embedding saves its input)."""
        towers = (self.image, self.text)
        if checkpointing:
            per_sample = (sum(t.checkpoint_bytes(elem) for t in towers)
                          + max(t.layer_activation_bytes(elem) for t in towers))
        else:
            per_sample = sum(t.layers * t.layer_activation_bytes(elem) for t in towers)
        per_sample += 3 * self.image_size ** 2 * (1 + elem)
        factor = ACTIVATION_CALIBRATION.get((self.name, checkpointing)) or 1.0
        return chunk * per_sample * factor


def _check_keys(where: str, cfg: dict, allowed: set, name: str) -> None:
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise PlanError(f"plan: model {name}: {where} sets {', '.join(unknown)}, which the planner does not "
                               "model (it estimates open_clip ViT image towers and transformer text towers)")


def _layers_params(cfg: dict, layers: int, width: int, mlp: int) -> int:
    """Per layer: ln_1, the qkv and out projections with biases, ln_2, the two MLP linears
    with biases, and two layer-scale vectors when the config sets ls_init_value."""
    per_layer = 4 * width * width + 2 * width * mlp + 9 * width + mlp
    if cfg.get("ls_init_value") is not None:
        per_layer += 2 * width
    return layers * per_layer


def vision_tower(cfg: dict, embed_dim: int, name: str) -> Tower:
    _check_keys("vision_cfg", cfg, _VISION_KEYS, name)
    layers, width = cfg.get("layers", 12), cfg.get("width", 768)
    if not isinstance(layers, int):
        raise PlanError(f"plan: model {name}: a ResNet image tower (layers={layers}) is not modelled")
    image_size, patch = cfg.get("image_size", 224), cfg.get("patch_size", 16)
    if not isinstance(image_size, int):
        raise PlanError(f"plan: model {name}: non-square image_size {image_size} is not modelled")
    patches = (image_size // patch) ** 2
    tokens = patches + 1
    mlp = int(width * cfg.get("mlp_ratio", 4.0))
    params = (3 * patch * patch * width      # conv1, no bias
              + width + tokens * width        # class and positional embeddings
              + 2 * width + 2 * width         # ln_pre, ln_post
              + _layers_params(cfg, layers, width, mlp)
              + width * embed_dim)            # proj
    return Tower(layers=layers, width=width, heads=width // cfg.get("head_width", 64), mlp_width=mlp,
                 tokens=tokens, params=params,
                 extra_flops=2 * patches * 3 * patch * patch * width + 2 * width * embed_dim)


def text_tower(cfg: dict, embed_dim: int, name: str) -> Tower:
    _check_keys("text_cfg", cfg, _TEXT_KEYS, name)
    layers, width = cfg.get("layers", 12), cfg.get("width", 512)
    context, vocab = cfg.get("context_length", 77), cfg.get("vocab_size", 49408)
    mlp = int(width * cfg.get("mlp_ratio", 4.0))
    params = (vocab * width + context * width  # token and positional embeddings
              + 2 * width                       # ln_final
              + _layers_params(cfg, layers, width, mlp)
              + width * embed_dim)              # text_projection
    return Tower(layers=layers, width=width, heads=cfg.get("heads", 8), mlp_width=mlp, tokens=context,
                 params=params, extra_flops=2 * width * embed_dim)


def model_config(name: str) -> dict:
    """open_clip's config for ``name``, the project's tiny models included."""
    import open_clip
    try:
        from ..models import register_tiny_configs
    except ImportError:  # an older checkout without the tiny models
        pass
    else:
        register_tiny_configs()
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise PlanError(f"plan: open_clip has no model config named {name!r}")
    return cfg


def estimate_model(name: str, cfg: Optional[dict] = None) -> ModelEstimate:
    """The estimate for open_clip model ``name`` (its config read from open_clip unless given)."""
    cfg = model_config(name) if cfg is None else cfg
    _check_keys("the config", cfg, _TOP_KEYS, name)
    embed_dim = cfg["embed_dim"]
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    return ModelEstimate(name=name, embed_dim=embed_dim, image_size=vision.get("image_size", 224),
                         context_length=text.get("context_length", 77),
                         image=vision_tower(vision, embed_dim, name), text=text_tower(text, embed_dim, name))
