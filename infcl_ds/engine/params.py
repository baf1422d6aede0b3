"""Parameter fix-ups DeepSpeed needs.

DeepSpeed 0.19.x broadcasts and flattens parameters through ``p.data.view(torch.uint8)``,
which fails on a 0-dim tensor (open_clip's ``logit_scale``: "self.dim() cannot be 0 to view
... as Byte"). Such parameters are given shape [1] before ``deepspeed.initialize`` (the
model's arithmetic broadcasts the same); the export (infcl_ds/export.py) reshapes every
tensor to the architecture's own shapes, so ``open_clip.create_model(name).load_state_dict(...,
strict=True)`` still takes them.

ZeRO-3 gathers a module's parameters in hooks around that module's forward, but
``nn.MultiheadAttention`` (open_clip's transformers) passes ``out_proj.weight`` to
``F.multi_head_attention_forward`` without calling ``out_proj``. Outside the top module's
forward that reads the shard ("mat2 must be a matrix, got 1-D tensor"); inside it DeepSpeed
gathers the parameter on access, one blocking all-gather per parameter. Marked a ZeRO-3
leaf, the attention module gathers all its parameters, out_proj's included, together in
its own hook.
"""
from typing import List

import torch


def promote_scalar_parameters(model: torch.nn.Module) -> List[str]:
    """Give every 0-dim parameter shape [1] in place; return their names."""
    names = []
    for name, param in model.named_parameters():
        if param.dim() == 0:
            param.data = param.data.reshape(1)
            names.append(name)
    return names


def mark_zero3_leaf_modules(model: torch.nn.Module) -> None:
    """Flag every nn.MultiheadAttention in ``model`` a ZeRO-3 leaf (before ``deepspeed.initialize``,
    which installs the hooks); models without one are left as they are."""
    from deepspeed.utils import set_z3_leaf_modules
    set_z3_leaf_modules(model, [torch.nn.MultiheadAttention], raise_if_not_found=False)
