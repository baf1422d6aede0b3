"""Faster forwards for open_clip's tower modules: the same function on the same parameters.

`fast_tower_modules(model)` changes the class, and only the class, of two kinds of module, so
the parameters, their names (the state dict, checkpoints, open_clip's pretrained weights) and
any hooks stay. The engine applies it to every model it trains, eager, compiled or under
ZeRO-3 (`ContrastiveEngine.create`). `launch/probe_towers.py` times the towers' chunk passes
with and without it (docs/benchmarks.md, "The GELU epilogue on the towers alone").

Self-attention from the packed QKV projection. open_clip's ResidualAttentionBlock runs
`nn.MultiheadAttention`, whose functional path moves the batch-first input to sequence-first,
splits the packed projection with a `.contiguous()` copy, folds the heads into the batch, and
undoes all of it after attention: layout copies of the activations around every attention
call, forward and backward, which stay separate kernels when compiled (the GEMMs and cuDNN's
attention are external to inductor). `PackedSelfAttention` makes one GEMM give (N, L, 3, H, d),
hands strided q, k, v views of it to `scaled_dot_product_attention`, and takes the output back
to (N, L, E) for `out_proj`. The calls it does not cover (cross attention, attention weights,
key padding or boolean masks, `is_causal`) go to `nn.MultiheadAttention.forward`.

The patch embedding as one GEMM. A ViT's patch embedding is a convolution whose stride is its
kernel: the patches do not overlap, so it is exactly the product of the (N * patches, C k k)
patch rows with the (width, C k k) kernel. cuDNN ran the bf16 convolution far below the GEMMs'
rate (0.55 s of a 16 s ViT-B-16 step at 32k for about 0.01 s of work; `cudnn.benchmark` did
not change it); as a GEMM it goes to cuBLAS with the towers' linear layers, its weight gradient
too. Convolutions of any other kind run as before.
"""
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from .settings import EngineSettings


class PackedSelfAttention(nn.MultiheadAttention):
    """An `nn.MultiheadAttention` whose self-attention calls skip the layout copies.

    `in_proj_module`, where set (engine/float8.py does), computes the packed projection from
    the same `in_proj_weight` and `in_proj_bias` Parameters in place of `F.linear`; it is kept
    out of the module's children, so the state dict and `parameters()` are unchanged."""

    in_proj_module = None

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        covered = (key is query and value is query and query.dim() == 3 and not need_weights
                   and key_padding_mask is None and not is_causal
                   and (attn_mask is None or (attn_mask.is_floating_point() and attn_mask.dim() in (2, 3))))
        if not covered:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)
        x = query if self.batch_first else query.transpose(0, 1)
        n, length, width = x.shape
        qkv = (F.linear(x, self.in_proj_weight, self.in_proj_bias) if self.in_proj_module is None
               else self.in_proj_module(x)).view(n, length, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (N, H, L, d): views, no copy
        if attn_mask is not None:
            # nn.MultiheadAttention's masks: (L, L), or (N * H, L, L) with the heads inside the batch.
            attn_mask = attn_mask.to(q.dtype)
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.view(n, self.num_heads, length, length)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, width))
        return (out if self.batch_first else out.transpose(0, 1)), None


class PatchEmbeddingGemm(nn.Conv2d):
    """An `nn.Conv2d` with stride == kernel, computed as a GEMM over the patches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            return super().forward(x)
        (kh, kw), (n, c, h, w) = self.kernel_size, x.shape
        gh, gw = h // kh, w // kw  # as the convolution: rows and columns that fill no patch are dropped
        patches = (x[:, :, :gh * kh, :gw * kw].reshape(n, c, gh, kh, gw, kw)
                   .permute(0, 2, 4, 1, 3, 5).reshape(n * gh * gw, c * kh * kw))
        out = F.linear(patches, self.weight.reshape(self.out_channels, -1), self.bias)
        return out.view(n, gh, gw, self.out_channels).permute(0, 3, 1, 2)  # (N, width, gh, gw), the convolution's


@torch.library.custom_op("infcl_ds::linear_gelu_tanh", mutates_args=())
def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(x @ weight.T + bias) for 2-D x on CUDA: cuBLASLt's GELU_BIAS epilogue, one kernel.
    A custom op so that inductor keeps it whole (it decomposes `_addmm_activation` into its parts)."""
    return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)


@linear_gelu_tanh.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


class EpilogueGeluMlp(nn.Sequential):
    """open_clip's MLP (c_fc, GELU, c_proj) whose no-grad calls take c_fc's bias and the GELU into
    the GEMM's epilogue (cuBLASLt), saving a read and a write of the 4x-wide hidden. The engine's
    encode pass (a quarter of the towers' work, no grad) runs this way; the re-encode with grad
    runs the module as before (the epilogue keeps no pre-activation for the backward).

    cuBLASLt's GELU is the tanh approximation, nn.GELU's the erf one: they differ by at most 4.7e-4
    (at 2.7, where bf16's step is 1.6e-2), below bf16's rounding of the hidden, so only bf16 and
    fp16 calls take it (float32 and float64 stay exact). Left to the module's own forward: c_fc
    converted since (float8), hooked, or partitioned by ZeRO-3 (its hooks gather c_fc's weight
    only when c_fc itself is called)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc = self.c_fc
        if (torch.is_grad_enabled() or not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16)
                or type(fc) is not nn.Linear or fc.weight.dtype != x.dtype or fc.bias is None
                or fc._forward_hooks or fc._forward_pre_hooks or hasattr(fc.weight, "ds_id")
                or torch.is_autocast_enabled()):
            return super().forward(x)
        hidden = linear_gelu_tanh(x.reshape(-1, x.shape[-1]), fc.weight, fc.bias)
        return self.c_proj(hidden.view(*x.shape[:-1], hidden.shape[-1]))


def _epilogue_mlp(module: nn.Module) -> bool:
    """open_clip's block MLP with nn.GELU (not QuickGELU) around two plain nn.Linear layers."""
    return (type(module) is nn.Sequential and list(module._modules) == ["c_fc", "gelu", "c_proj"]
            and type(module.c_fc) is nn.Linear and type(module.c_proj) is nn.Linear
            and type(module.gelu) is nn.GELU)


def _packable(module: nn.Module) -> bool:
    """Plain self-attention modules: one packed projection, no extra key/value biases."""
    return (type(module) is nn.MultiheadAttention and module._qkv_same_embed_dim
            and module.in_proj_weight is not None and module.bias_k is None and not module.add_zero_attn)


def _is_patch_embedding(module: nn.Module) -> bool:
    return (type(module) is nn.Conv2d and module.stride == module.kernel_size and module.padding == (0, 0)
            and module.dilation == (1, 1) and module.groups == 1 and module.padding_mode == "zeros")


def _swap_classes(model: nn.Module, wanted, new_class) -> int:
    changed = 0
    for module in model.modules():
        if wanted(module):
            module.__class__ = new_class
            changed += 1
    return changed


def fast_tower_modules(model: nn.Module, attention: bool = True, patch_embedding: bool = True,
                       mlp_epilogue: bool = EngineSettings.gelu_epilogue) -> Dict[str, int]:
    """The fast forwards on `model` (all three unless one is turned off: launch/probe_towers.py
    times them apart), in place; how many modules of each kind changed (none the second time).
    The engine always says which: `mlp_epilogue` is its settings' gelu_epilogue (model.gelu_epilogue,
    whose default is the recipe's, config/recipe.py)."""
    return {"attention": _swap_classes(model, _packable, PackedSelfAttention) if attention else 0,
            "patch_embedding": _swap_classes(model, _is_patch_embedding, PatchEmbeddingGemm) if patch_embedding else 0,
            "mlp_epilogue": _swap_classes(model, _epilogue_mlp, EpilogueGeluMlp) if mlp_epilogue else 0}
