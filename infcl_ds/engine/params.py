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

cuBLAS runs Hopper's GEMMs only on 16-byte aligned operands; a weight 2 bytes off falls back to
sm75 kernels, several times slower (CHANGELOG.md, 2026-11-25, has the cost). DeepSpeed packs bf16
parameters back to back: ZeRO-1/2 one flat buffer per optimizer group, ZeRO-3 one buffer for all
groups, which on one rank are also the gathered parameters. One odd-sized tensor early (open_clip's
[1] logit scale, in the no-decay group that ``clip_param_groups`` lists first) would put every
later one 2 bytes off. ``align_for_flat_buffers`` orders the parameters, and under ZeRO-3 the
groups, so that each tensor starts on a 16-byte boundary.
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


def off_16_bytes(param: torch.Tensor) -> bool:
    """True when the tensor, packed in bf16, is not a multiple of 16 bytes (it would misalign the
    next one). Counted in bf16 whatever its dtype now: DeepSpeed casts the model in ``initialize``."""
    return param.numel() % 8 != 0


def align_for_flat_buffers(optimizer, zero3: bool) -> None:
    """In place, before ``deepspeed.initialize``: in each group the parameters of a 16-byte
    multiple first; under ZeRO-3 also the groups holding none of another size before those that
    do, so that its single flat buffer has odd-sized tensors only at its end (the [1] logit scale
    and bias of open_clip's no-decay group). With two groups holding odd-sized tensors, the
    weights of the later one stay misaligned. Groups are reordered only when they share one
    learning rate: an LR scheduler built before this call lists its base rates by position."""
    for group in optimizer.param_groups:
        group["params"] = sorted(group["params"], key=off_16_bytes)
    if zero3 and len({group.get("lr") for group in optimizer.param_groups}) == 1:
        optimizer.param_groups.sort(key=lambda group: any(off_16_bytes(p) for p in group["params"]))


def mark_zero3_leaf_modules(model: torch.nn.Module) -> None:
    """Flag every nn.MultiheadAttention in ``model`` a ZeRO-3 leaf (before ``deepspeed.initialize``,
    which installs the hooks); models without one are left as they are."""
    from deepspeed.utils import set_z3_leaf_modules
    set_z3_leaf_modules(model, [torch.nn.MultiheadAttention], raise_if_not_found=False)
