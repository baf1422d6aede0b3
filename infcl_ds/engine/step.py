"""One optimizer step of a CLIP model over a local batch of any size, GradCache style.

1. Encode the local batch chunk by chunk without grad, saving each chunk's RNG state.
2. The global loss over all ranks' features (the ring), backpropagated to the cached
   features and the logit scale only.
3. Re-encode each chunk with grad (RNG replayed, so dropout matches) and backpropagate its
   cached feature gradients through the DeepSpeed engine. DeepSpeed averages gradients over
   the W data-parallel ranks, so feature gradients enter multiplied by W and the logit
   scale's (already the full gradient on every rank) does not (docs/semantics.md).
   Gradients are reduced once per step: ZeRO >= 1 inside `coalesce_grad_reduction()`,
   ZeRO 0 inside `no_sync()` for all chunks but the last.
4. One optimizer step.
"""
import math
from contextlib import nullcontext
from typing import Optional

import torch
import torch.nn.functional as F

from ..loss import contrastive_loss


def _rng_state(device):
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class ContrastiveEngine:
    """Wraps a DeepSpeed engine around an open_clip-style model
    (``encode_image``, ``encode_text``, ``logit_scale``)."""

    def __init__(self, ds_engine, chunk_size: int, group=None, world_size: Optional[int] = None,
                 verify_replay: bool = False):
        self.engine = ds_engine
        self.chunk_size = chunk_size
        # Debug aid: check that each re-encoded chunk reproduces its cached features (dropout,
        # random augmentation replayed); a mismatch means the cached gradients are stale.
        self.verify_replay = verify_replay
        self.group = group
        if world_size is None:
            import torch.distributed as torch_dist
            world_size = torch_dist.get_world_size(group) if torch_dist.is_initialized() else 1
        self.world_size = world_size

    @classmethod
    def create(cls, model, config: dict, chunk_size: int, optimizer=None, group=None, verify_replay=False,
               **ds_kwargs):
        """Fix up the model's parameters for DeepSpeed, build the engine, wrap it."""
        import deepspeed

        from .params import promote_scalar_parameters
        scalar_names = promote_scalar_parameters(model)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, **ds_kwargs)
        wrapped = cls(engine, chunk_size, group, verify_replay=verify_replay)
        wrapped.scalar_parameter_names = scalar_names
        return wrapped

    @property
    def model(self):
        return self.engine.module

    @staticmethod
    def _check_replay(k, fi, cached_i, ft, cached_t):
        err = max((fi.detach() - cached_i.detach()).abs().max().item(), (ft.detach() - cached_t.detach()).abs().max().item())
        if err > 1e-5:
            raise RuntimeError(f"chunk {k}: re-encoding with grad differs from the cached features by {err:.2e}; "
                               "the model's randomness is not replayed by the saved RNG states")

    def _full(self, param):
        """The whole parameter inside the block (a no-op below ZeRO-3)."""
        if self.engine.zero_optimization_stage() < 3:
            return nullcontext()
        import deepspeed
        return deepspeed.zero.GatheredParameters([param])

    def _encode(self, images, texts):
        return (F.normalize(self.model.encode_image(images), dim=-1),
                F.normalize(self.model.encode_text(texts), dim=-1))

    def _chunks(self, n):
        return [(i, min(i + self.chunk_size, n)) for i in range(0, n, self.chunk_size)]

    def backward(self, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        """Steps 1-3: gradients of the global loss on every parameter; returns the loss."""
        device = next(self.model.parameters()).device
        chunks = self._chunks(images.shape[0])
        # 1. Features without grad; inputs move to the device one chunk at a time.
        states, img_feats, txt_feats = [], [], []
        with torch.no_grad():
            for lo, hi in chunks:
                states.append(_rng_state(device))
                fi, ft = self._encode(images[lo:hi].to(device), texts[lo:hi].to(device))
                img_feats.append(fi)
                txt_feats.append(ft)
        after = _rng_state(device)
        # 2. Global loss -> gradients of the cached features and of the scale.
        img_cache = torch.cat(img_feats).requires_grad_()
        txt_cache = torch.cat(txt_feats).requires_grad_()
        with self._full(self.model.logit_scale):  # ZeRO-3 holds only a shard outside forward
            scale = self.model.logit_scale.detach().exp().clone().requires_grad_()
        loss = contrastive_loss(img_cache, txt_cache, scale, self.group)
        loss.backward()
        grad_img, grad_txt = img_cache.grad * self.world_size, txt_cache.grad * self.world_size
        # 3. Re-encode with grad, one backward per chunk, one reduction per step.
        stage = self.engine.zero_optimization_stage()
        coalesce = self.engine.coalesce_grad_reduction() if stage >= 1 else nullcontext()
        with coalesce:
            for k, ((lo, hi), state) in enumerate(zip(chunks, states)):
                _set_rng_state(state, device)
                last = k == len(chunks) - 1
                sync = nullcontext() if (stage >= 1 or last) else self.engine.no_sync()
                with sync:
                    fi, ft = self._encode(images[lo:hi].to(device), texts[lo:hi].to(device))
                    if self.verify_replay:
                        self._check_replay(k, fi, img_cache[lo:hi], ft, txt_cache[lo:hi])
                    surrogate = (fi * grad_img[lo:hi]).sum() + (ft * grad_txt[lo:hi]).sum()
                    if k == 0:  # d loss / d logit_scale = d loss / d s * s, counted once
                        with self._full(self.model.logit_scale):
                            surrogate = surrogate + (self.model.logit_scale.exp() * scale.grad).sum()
                            self.engine.backward(surrogate, scale_wrt_gas=False)
                    else:
                        self.engine.backward(surrogate, scale_wrt_gas=False)
        _set_rng_state(after, device)
        return loss.detach()

    def train_step(self, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        """Steps 1-4: gradients, one optimizer step, and OpenCLIP's clamp of the logit scale
        to ln(100), applied to the fp32 master copy (else the next step would undo it)."""
        loss = self.backward(images, texts)
        self.engine.step()
        self._clamp_logit_scale(math.log(100.0))
        return loss

    def _clamp_logit_scale(self, upper: float) -> None:
        from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param
        param = self.model.logit_scale
        master = safe_get_full_fp32_param(param)
        if master is None:  # no ZeRO optimizer: the parameter is its own master copy
            with torch.no_grad():
                param.clamp_(max=upper)
        elif bool(master.max() > upper):
            safe_set_full_fp32_param(param, master.clamp(max=upper))
