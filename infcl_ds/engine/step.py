"""One optimizer step of a CLIP model over a local batch of any size, GradCache style.

1. Encode the local batch chunk by chunk without grad, saving each chunk's RNG state.
2. The global loss over all ranks' features (the ring), backpropagated to the cached
   features and the logit scale only.
3. Re-encode each chunk with grad (RNG replayed, so dropout matches) and backpropagate its
   cached feature gradients through the DeepSpeed engine. DeepSpeed averages gradients over
   the W data-parallel ranks, so feature gradients enter multiplied by W and the logit
   scale's (already the full gradient on every rank) does not (docs/semantics.md).
   With a loss that uses a bias (the sigmoid one, ``loss="siglip"``) the model's
   ``logit_bias`` is handled like the scale: its full gradient on every rank, entering once.
   Gradients are reduced once per step: ZeRO >= 1 inside `coalesce_grad_reduction()`,
   ZeRO 0 inside `no_sync()` for all chunks but the last.
4. One optimizer step.
"""
import math
from contextlib import contextmanager, nullcontext
from typing import Optional

import torch
import torch.nn.functional as F

from .grad_sum import Fp32GradSum
from .inputs import TensorBatch
from .loss_adapter import loss_adapter
from .phases import PhaseMeter
from .settings import EngineSettings


def _rng_state(device):
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def engine_passes(chunks: int, zero_stage: int, offload_features: bool = False, verify_replay: bool = False) -> int:
    """Passes of the towers over a local batch of `chunks` chunks: 1 for a batch of one chunk,
    encoded once with grad and its graph kept through the loss (3 passes of forward-sized work
    instead of 4, the same gradients); else 2 (without grad, then with grad). Not one under
    ZeRO-3 (the loss phase gathers the logit scale between the forward and the backward of a
    partitioned model), nor with feature offload or the replay check, which exist for the
    chunked path. Each pass asks for every chunk in order: the engine announces the passes to a
    batch that decodes ahead (`announce_passes`, once per step), and the planner counts decodes
    with this function."""
    one = chunks == 1 and zero_stage < 3 and not offload_features and not verify_replay
    return 1 if one else 2


class ContrastiveEngine:
    """Wraps a DeepSpeed engine (``.deepspeed``) around an open_clip-style model: ``forward(image,
    text)`` giving normalised features and exp(logit_scale) as open_clip's CLIP does, or just
    ``encode_image``, ``encode_text`` and a ``logit_scale`` parameter (see ``_encode``).

    settings: its EngineSettings (engine/settings.py). loss_fn: another function in place of the
    settings' loss's, same signature (benchmarks swap in inf-cl's or OpenCLIP's). group: the ranks
    the loss runs over, DeepSpeed's data-parallel ones (default: the world)."""

    def __init__(self, deepspeed_engine, settings: EngineSettings, group=None, world_size: Optional[int] = None,
                 loss_fn=None):
        self.deepspeed = deepspeed_engine
        self.settings = settings
        self.loss = loss_adapter(settings.loss, loss_fn)
        self.phases = PhaseMeter(enabled=settings.time_phases)
        self.group = group
        if world_size is None:
            import torch.distributed as torch_dist
            world_size = torch_dist.get_world_size(group) if torch_dist.is_initialized() else 1
        self.world_size = world_size

    @classmethod
    def create(cls, model, ds_config: dict, settings: EngineSettings, *, optimizer=None, group=None, loss_fn=None,
               **ds_kwargs) -> "ContrastiveEngine":
        """Fix up the model's parameters for DeepSpeed, give its towers the fast forwards
        (engine/towers.py; the MLP epilogue with settings.gelu_epilogue), convert its linear
        layers to float8 (settings.float8, engine/float8.py), compile its encoders
        (settings.compile_backend, engine/compile.py), then build the DeepSpeed engine from
        `ds_config` (`ds_kwargs`: more of deepspeed.initialize's arguments, e.g. lr_scheduler)
        and wrap it."""
        import deepspeed

        from ..config.recipe import compile_stage_refusal, float8_stage_refusal
        from .params import align_for_flat_buffers, mark_zero3_leaf_modules, promote_scalar_parameters
        from .towers import fast_tower_modules
        adapter = loss_adapter(settings.loss, loss_fn)
        if (getattr(model, "logit_bias", None) is not None) != adapter.uses_bias:
            raise ValueError(adapter.wrong_model)
        stage = ds_config.get("zero_optimization", {}).get("stage", 0)
        # Before the model is changed: a refused engine leaves it as it was.
        refusal = (float8_stage_refusal(settings.float8, stage)
                   or (compile_stage_refusal(stage) if settings.compile_backend is not None else None))
        if refusal:
            raise ValueError(refusal)
        promote_scalar_parameters(model)
        # The same function, fewer kernels (engine/towers.py).
        fast_tower_modules(model, mlp_epilogue=settings.gelu_epilogue)
        if settings.float8:
            from .float8 import float8_linears
            float8_linears(model, emulate=settings.float8 == "emulate")
        if settings.compile_backend is not None:
            from .compile import compile_encoders
            compile_encoders(model, settings.compile_backend)
        if stage == 3:
            mark_zero3_leaf_modules(model)
        if optimizer is not None:
            align_for_flat_buffers(optimizer, stage == 3)
        deepspeed_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config, **ds_kwargs)
        wrapped = cls(deepspeed_engine, settings, group, loss_fn=loss_fn)
        dp = getattr(deepspeed_engine, "dp_world_size", wrapped.world_size)
        if dp != wrapped.world_size:
            # The feature gradients are scaled by the loss group's size to undo DeepSpeed's
            # average over its data-parallel ranks: the two must be the same ranks.
            raise ValueError(f"the loss group has {wrapped.world_size} ranks but DeepSpeed averages gradients over "
                             f"{dp} data-parallel ranks; pass group= the data-parallel group")
        return wrapped

    @property
    def model(self):
        return self.deepspeed.module

    @staticmethod
    def _check_replay(k, fi, cached_i, ft, cached_t):
        err = max((fi.detach() - cached_i.detach()).abs().max().item(), (ft.detach() - cached_t.detach()).abs().max().item())
        if err > 1e-5:
            raise RuntimeError(f"chunk {k}: re-encoding with grad differs from the cached features by {err:.2e}; "
                               "the model's randomness is not replayed by the saved RNG states")

    def _full(self, param, modify: bool = False):
        """The whole parameter inside the block (a no-op below ZeRO-3); with ``modify``, rank
        0's changes are written back to every shard on exit."""
        if self.deepspeed.zero_optimization_stage() < 3:
            return nullcontext()
        import deepspeed
        return deepspeed.zero.GatheredParameters([param], modifier_rank=0 if modify else None)
    full_parameter = _full  # public, for readers outside the step (the trainer's logit-scale metric)

    def _encode(self, images, texts):
        """Normalised image and text features, exp(logit_scale) and logit_bias where the
        model's forward gives them (else None: see ``_scale_in_graph``).

        Through the model's own ``__call__`` where it has a forward (open_clip's CLIP returns
        (image, text, logit_scale.exp(), ...), or a dict with ``output_dict``): ZeRO-3 gathers
        parameters only around module forwards, and open_clip's encoders read the top module's
        positional_embedding, text_projection and logit_scale in no submodule's forward, so a
        direct ``encode_text`` call would see their shards. Models with only the encoders (no
        forward) are encoded directly, fine while their parameters all sit in the submodules
        the encoders call."""
        if type(self.model).forward is torch.nn.Module.forward:
            return (F.normalize(self.model.encode_image(images), dim=-1),
                    F.normalize(self.model.encode_text(texts), dim=-1), None, None)
        out = self.model(images, texts)
        if isinstance(out, dict):
            return out["image_features"], out["text_features"], out["logit_scale"], out.get("logit_bias")
        return out[0], out[1], out[2], (out[3] if len(out) > 3 else None)

    @contextmanager
    def _scale_in_graph(self, scale):
        """exp(logit_scale) in the autograd graph for the chunk that carries its gradient: the
        forward's own output where there is one (gathered by ZeRO-3's hooks like every other
        parameter; in the model's dtype, so bf16 under bf16); otherwise computed here in fp32
        from the whole parameter, which stays gathered until the backward inside the block."""
        if scale is not None:
            yield scale
            return
        with self._full(self.model.logit_scale):
            yield self.model.logit_scale.float().exp()

    @contextmanager
    def _bias_in_graph(self, bias):
        """logit_bias in the graph, like ``_scale_in_graph`` (None for a loss without a bias)."""
        if bias is not None or not self.loss.uses_bias:
            yield bias
            return
        with self._full(self.model.logit_bias):
            yield self.model.logit_bias.float()

    def _chunks(self, n):
        return [(i, min(i + self.settings.chunk_size, n)) for i in range(0, n, self.settings.chunk_size)]

    @property
    def input_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.deepspeed.bfloat16_enabled() else torch.float32

    def _store(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """A buffer for ``rows`` cached rows shaped like one chunk's features: on the device,
        or in pinned host memory with offload_features (then on the GPU only for the loss)."""
        if not self.settings.offload_features:
            return torch.empty((rows,) + like.shape[1:], dtype=like.dtype, device=like.device)
        return torch.empty((rows,) + like.shape[1:], dtype=like.dtype, pin_memory=like.is_cuda)

    def forward_backward(self, images, texts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Steps 1-3: gradients of the global loss on every parameter; returns the loss.

        ``images`` is a ChunkedBatch (e.g. infcl_ds.data.HostBatch) or, with ``texts``, the two
        input tensors; inputs move to the device one chunk at a time, in both passes."""
        batch = images if texts is None else TensorBatch(images, texts)
        device = next(self.model.parameters()).device
        chunks = self._chunks(len(batch))
        passes = [chunks] * self._passes(len(chunks))  # every pass asks for every chunk, in order
        announce = getattr(batch, "announce_passes", None)
        if announce is not None:  # a batch that decodes ahead learns the order it will be asked in
            announce(passes)
        if len(passes) == 1:
            return self._forward_backward_one_chunk(batch, chunks[0], device)
        with self.phases("encode"):
            states, feats = self._encode_without_grad(batch, chunks, device)
        after = _rng_state(device)
        with self.phases("loss"):
            loss, feat_grads, scalar_grads = self._loss_and_feature_grads(feats, device)
        cached = feats if self.settings.verify_replay else None
        del feats
        with self.phases("reencode"):
            self._reencode_with_grad(batch, chunks, states, feat_grads, scalar_grads, device, cached)
        _set_rng_state(after, device)
        return loss

    def _passes(self, chunks: int) -> int:
        settings = self.settings
        return engine_passes(chunks, self.deepspeed.zero_optimization_stage(), settings.offload_features,
                             settings.verify_replay)

    def _forward_backward_one_chunk(self, batch, chunk, device):
        lo, hi = chunk  # one chunk: its gradients need no fp32 sum across chunks
        with self.phases("encode"):
            fi, ft, scale, bias = self._encode(*batch.chunk(lo, hi, device, self.input_dtype))
        with self.phases("loss"):
            loss, (gi, gt), scalar_grads = self._loss_and_feature_grads((fi.detach(), ft.detach()), device)
        with self.phases("reencode"):  # the backward only: the forward above kept its graph
            self._backward_cached_grads(fi, ft, gi, gt, scale, bias, scalar_grads)
        return loss

    def _encode_without_grad(self, batch, chunks, device):
        """1. Features of every chunk without grad, each chunk's RNG state saved for the replay."""
        states, stores = [], None
        with torch.no_grad():
            for lo, hi in chunks:
                states.append(_rng_state(device))
                fi, ft, *_ = self._encode(*batch.chunk(lo, hi, device, self.input_dtype))
                if stores is None:
                    stores = (self._store(len(batch), fi), self._store(len(batch), ft))
                stores[0][lo:hi].copy_(fi, non_blocking=True)
                stores[1][lo:hi].copy_(ft, non_blocking=True)
        return states, stores

    def _loss_and_feature_grads(self, feats, device):
        """2. The global loss over all ranks (the ring), backpropagated to the cached features
        and the logit scale (and bias) only. Feature gradients are scaled by W: DeepSpeed
        averages. Returns (loss, feature gradients, (d scale, d bias or None))."""
        img, txt = (f.to(device, non_blocking=True).requires_grad_() for f in feats)
        with self._full(self.model.logit_scale):  # ZeRO-3 holds only a shard outside forward
            scale = self.model.logit_scale.detach().float().exp().clone().requires_grad_()
        bias = None
        if self.loss.uses_bias:
            with self._full(self.model.logit_bias):
                bias = self.model.logit_bias.detach().float().clone().requires_grad_()
        loss = self.loss(img, txt, scale, bias, self.group)
        loss.backward()
        grads = []
        for f in (img, txt):
            g = f.grad.mul_(self.world_size)
            f.grad = None
            offload = self.settings.offload_features
            grads.append(self._store(g.shape[0], g).copy_(g, non_blocking=True) if offload else g)
        return loss.detach(), grads, (scale.grad, None if bias is None else bias.grad)

    def _reencode_with_grad(self, batch, chunks, states, feat_grads, scalar_grads, device, cached):
        """3. Re-encode each chunk with grad (RNG replayed) and backpropagate its cached feature
        gradients; one gradient reduction per step, summed in fp32 for bf16 models."""
        stage = self.deepspeed.zero_optimization_stage()
        grad_sum = self._grad_sum()
        coalesce = self.deepspeed.coalesce_grad_reduction() if stage >= 1 else nullcontext()
        with coalesce:
            for k, ((lo, hi), state) in enumerate(zip(chunks, states)):
                _set_rng_state(state, device)
                last = k == len(chunks) - 1
                if grad_sum is not None and last:
                    grad_sum.restore()
                sync = nullcontext() if (stage >= 1 or last) else self.deepspeed.no_sync()
                with sync:
                    fi, ft, scale, bias = self._encode(*batch.chunk(lo, hi, device, self.input_dtype))
                    if cached is not None:
                        self._check_replay(k, fi, cached[0][lo:hi].to(device), ft, cached[1][lo:hi].to(device))
                    gi, gt = (g[lo:hi].to(device, non_blocking=True) for g in feat_grads)
                    # The scale's (and bias's) gradient enters with the first chunk only.
                    self._backward_cached_grads(fi, ft, gi, gt, scale, bias, scalar_grads if k == 0 else None)
                if grad_sum is not None and not last:
                    grad_sum.fold()

    def _backward_cached_grads(self, fi, ft, gi, gt, scale, bias, scalar_grads) -> None:
        """Backpropagate the cached gradients gi, gt of the loss through the features fi, ft, and,
        with ``scalar_grads`` = (d loss / d s, d loss / d bias or None), through exp(logit_scale)
        and logit_bias (d loss / d logit_scale = d loss / d s * s): one surrogate whose gradient
        is the loss's."""
        surrogate = (fi * gi).float().sum() + (ft * gt).float().sum()
        if scalar_grads is None:
            self.deepspeed.backward(surrogate, scale_wrt_gas=False)
            return
        scale_grad, bias_grad = scalar_grads
        with self._scale_in_graph(scale) as s, self._bias_in_graph(bias) as b:
            surrogate = surrogate + (s.float() * scale_grad).sum()
            if bias_grad is not None:
                surrogate = surrogate + (b.float() * bias_grad).sum()
            self.deepspeed.backward(surrogate, scale_wrt_gas=False)

    def _grad_sum(self):
        """fp32 sums of the chunk gradients for a bf16 model (ZeRO 0-2; see grad_sum.py)."""
        if not (self.settings.grad_accum_fp32 and self.deepspeed.bfloat16_enabled()):
            return None
        if self.deepspeed.zero_optimization_stage() >= 3:
            # Between chunks a ZeRO-3 parameter holds only its shard, so a full-size sum cannot
            # be put back on it: chunk gradients add in bf16 there (docs/training.md).
            return None
        return Fp32GradSum(self.model.parameters())

    def train_step(self, images, texts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Steps 1-4: gradients, one optimizer step, and OpenCLIP's clamp of the logit scale
        to ln(100), applied to the fp32 master copy (else the next step would undo it)."""
        loss = self.forward_backward(images, texts)
        with self.phases("optimizer"):
            self.deepspeed.step()
            self._clamp_logit_scale(math.log(100.0))
        return loss

    def _clamp_logit_scale(self, upper: float) -> None:
        """Both copies: the fp32 master (else the next optimizer step writes the old value back)
        and the working parameter (else the next forward still uses it)."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param
        param = self.model.logit_scale
        master = safe_get_full_fp32_param(param)  # None without a ZeRO optimizer
        if master is not None and bool(master.max() > upper):
            safe_set_full_fp32_param(param, master.clamp(max=upper))
        # bf16 without ZeRO: FP16_UnfusedOptimizer keeps the fp32 copies in lists parallel
        # to the parameters', outside DeepSpeed's hp mapping (safe_get_* gives None).
        optimizer = self.deepspeed.optimizer
        for low, high in zip(getattr(optimizer, "fp16_groups", ()), getattr(optimizer, "fp32_groups", ())):
            for working, copy in zip(low, high):
                if working is param and isinstance(copy, torch.Tensor) and copy.shape == param.shape:
                    copy.data.clamp_(max=upper)
        with self._full(param, modify=True), torch.no_grad():
            param.clamp_(max=upper)
