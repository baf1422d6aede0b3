"""Bytes per GPU and per node for one training step, component by component.

A step has phases that never overlap in time (infcl_ds/engine/step.py); what each holds:

encoder pass  the peak of one chunk's re-encode with grad, at the start of its backward: the
              chunk's activations, and what lives across chunks: the fp32 sum of the chunk
              gradients (engine/grad_sum.py: each chunk's bf16 gradients are folded into it
              and freed, so they fill in only as the backward frees the activations), or
              without that sum the gradients themselves, accumulating on the parameters; and
              the cached feature gradients it backpropagates (in pinned host memory instead
              with batch.offload_features; the engine brings them to the GPU for the loss).
reduction     the end of the re-encode, activations freed: the whole gradients, and under
              ZeRO-1/2 DeepSpeed's reduce buckets and gradient partition, allocated only here
              (inside coalesce_grad_reduction() the per-parameter reduction hooks return
              early; the flush on exit calls setup_buckets()).
loss          the cached features of the whole local batch and their gradients, and the
              loss's buffers (the ring's over several ranks). No parameter gradients.

Parameters, optimizer states, ZeRO-3's buffers and the runtime reserve are there throughout.
The peak per GPU is the largest phase. Everything but the runtime reserve is memory that
torch's caching allocator hands out, i.e. what torch.cuda.max_memory_allocated reports;
the reserve stands for what it does not see (CUDA context, NCCL, fragmentation).
"""
import logging
from dataclasses import dataclass
from typing import Dict, Tuple

from ..config import Recipe, build_deepspeed_config
from ..data.footprint import (DEFAULT_IMAGE_BYTES, decode_pool_bytes, device_window_rows, host_kept_rows,
                              input_samples_held, kept_pixel_rows, sample_host_bytes)
from ..engine.tower_footprint import ModelEstimate
from ..ops.g_tiles import g_tile_bytes
from ..parallel.ring_bytes import ring_loss_bytes_per_sample, single_device_loss_bytes_per_sample
from ..resources import read_json

GIB = 1 << 30
DTYPE_BYTES = {"bf16": 2, "fp32": 4}

# Measured overheads, with their sources: calibration/overheads.json. GPU: what the device holds
# beyond torch.cuda.max_memory_allocated. Host, per rank: Python, torch, the CUDA host libraries
# and the rank's data-loader workers.
_OVERHEADS = read_json("calibration", "overheads.json")
GPU_RUNTIME_RESERVE = int(_OVERHEADS["gpu_runtime_reserve_gib"] * GIB)
HOST_RESERVE_PER_RANK = int(_OVERHEADS["host_reserve_per_rank_gib"] * GIB)

PARAMS, GRADS, OPTIM, GRAD_SUM = "parameters", "gradients", "optimizer states", "fp32 gradient sum"
ZERO_BUFFERS, RUNTIME = "ZeRO buffers", "runtime reserve"
ACTIVATIONS, FEATURES, FEATURE_GRADS, LOSS_BUFFERS = ("activations (one chunk)", "cached features",
                                                      "cached feature gradients", "loss and ring buffers")
ENCODER_PASS, REDUCTION, LOSS = "encoder pass", "reduction", "loss"
PIXELS_KEPT = "decoded chunks kept for the grad pass"
DEVICE_WINDOW = "the GPU decoder's window of decoded rows"


def gib(nbytes: float) -> str:
    """Bytes as GiB with one decimal, as the planner prints them."""
    return f"{nbytes / GIB:.1f}"


def _shard(nbytes: int, ways: int) -> int:
    return -(-nbytes // ways)


def model_state_bytes(params: int, dtype: str, stage: int, world: int, grad_accum_fp32: bool) -> Dict[str, int]:
    """Parameters, gradients and optimizer states per GPU.

    bf16: 2 B weights, 2 B gradients, 12 B fp32 master weights + Adam m and v per parameter;
    fp32: 4 + 4 + 8 (the weights are their own master copy). ZeRO-1 shards the optimizer
    states over the data-parallel ranks, ZeRO-3 the weights too. Gradients are not sharded
    here whatever the stage: the engine coalesces a step's chunks into one reduction, and
    DeepSpeed leaves every chunk's gradient whole on its parameter until then. A bf16 model
    below ZeRO-3 also keeps an fp32 sum of the chunk gradients (engine/grad_sum.py), whole.
    """
    if dtype == "bf16":
        weight, grad, optim = 2, 2, 12
        grad_sum = 4 if grad_accum_fp32 and stage < 3 else 0
    else:
        weight, grad, optim, grad_sum = 4, 4, 8, 0
    return {PARAMS: _shard(weight * params, world if stage >= 3 else 1),
            GRADS: grad * params,
            OPTIM: _shard(optim * params, world if stage >= 1 else 1),
            GRAD_SUM: grad_sum * params}


def deepspeed_zero_config(zero: dict):
    """DeepSpeed's own reading of a `zero_optimization` section (its DeepSpeedZeroConfig: every
    default filled in). Importing DeepSpeed logs its accelerator choice to stdout; that line is
    not the plan's, so DeepSpeed's logger passes nothing during the import."""
    silenced = logging.getLogger("DeepSpeed")
    drop_all = logging.Filter("\0")  # passes only records of a logger named NUL: none
    silenced.addFilter(drop_all)
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    finally:
        silenced.removeFilter(drop_all)
    return DeepSpeedZeroConfig(**zero)


def zero_buffer_bytes(zero: dict, elem: int, params: int = 0, world: int = 1, resident: bool = False) -> int:
    """DeepSpeed's gradient-reduction buffers, `zero` read as DeepSpeed reads it. ZeRO-1/2 with
    contiguous gradients: reduce_bucket_size elements per bucket, two with overlap_comm
    (double buffering), allocated whole whatever the model's size, and the rank's gradient
    partition (P / W elements) the reduced gradients are copied into; both only at the
    step's one coalesced reduction (module docstring). ZeRO-3: the reduce buckets and the
    prefetch bucket, counted throughout (not measured). `resident`: what a CPU rank's memory
    holds of them: the host commits a bucket's pages as gradients are written into it, so a
    bucket larger than the model's gradients holds only those."""
    if zero.get("stage", 0) == 0:
        return 0
    config = deepspeed_zero_config(zero)
    if not config.contiguous_gradients:
        return 0
    buckets = 2 if config.overlap_comm else 1
    bucket = min(int(config.reduce_bucket_size), params) if resident and params else int(config.reduce_bucket_size)
    total = buckets * bucket * elem
    if config.stage == 3:
        total += int(config.prefetch_bucket_size) * elem
    else:
        total += _shard(params, world) * elem
    return total


def feature_bytes(local: int, dim: int, elem: int) -> int:
    """The cached image and text features of a local batch (their gradients: the same again)."""
    return 2 * local * dim * elem


def loss_bytes(local: int, dim: int, elem: int, world: int) -> int:
    """What the loss allocates per GPU beyond its inputs and outputs, in its backward (the
    larger pass), for a local batch of ``local`` on every rank.

    Each part counted by its owner: the ring's buffers over several ranks, or on one GPU the
    single device's (parallel/ring_bytes.py), and the kernels' G tile (ops/g_tiles.py).
    """
    if world > 1:
        per_sample = ring_loss_bytes_per_sample(dim, elem)
    else:
        per_sample = single_device_loss_bytes_per_sample(dim)
    return local * per_sample + g_tile_bytes(local, local, dim, elem)


@dataclass(frozen=True)
class GpuMemory:
    """Bytes per GPU by component, and the components live in each phase."""
    components: Dict[str, int]
    phases: Dict[str, Tuple[str, ...]]

    def phase_bytes(self, phase: str) -> int:
        return sum(self.components[name] for name in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak(self) -> int:
        return self.phase_bytes(self.peak_phase)

    @property
    def allocated_peak(self) -> int:
        """The peak less the runtime reserve: what torch.cuda.max_memory_allocated should read."""
        return self.peak - (self.components[RUNTIME] if RUNTIME in self.phases[self.peak_phase] else 0)


def gpu_memory(model: ModelEstimate, recipe: Recipe, world: int, on_cpu: bool = False) -> GpuMemory:
    """Bytes per rank by component and phase; `on_cpu`: the ranks' tensors in host memory, where
    the untouched part of a ZeRO bucket takes no memory (zero_buffer_bytes)."""
    elem = DTYPE_BYTES[recipe.precision.dtype]
    local = recipe.local_batch(world)
    stage = recipe.zero.stage
    zero = build_deepspeed_config(recipe, world).get("zero_optimization", {})
    components = model_state_bytes(model.params, recipe.precision.dtype, stage, world,
                                   recipe.precision.grad_accum_fp32)
    components.update({
        ZERO_BUFFERS: zero_buffer_bytes(zero, elem, model.params, world, resident=on_cpu),
        RUNTIME: GPU_RUNTIME_RESERVE,
        ACTIVATIONS: int(model.activation_bytes(recipe.batch.chunk, elem, recipe.model.grad_checkpointing)),
        FEATURES: feature_bytes(local, model.embed_dim, elem),
        FEATURE_GRADS: feature_bytes(local, model.embed_dim, elem),
        LOSS_BUFFERS: loss_bytes(local, model.embed_dim, elem, world),
        PIXELS_KEPT: kept_pixel_rows(recipe.data, local, model.image_size, recipe.batch.chunk) * 3 * model.image_size ** 2,
        DEVICE_WINDOW: device_window_rows(recipe.data, local, model.image_size) * 3 * model.image_size ** 2,
    })
    # Decoded chunks kept from the first pass to the second fill up during the first, and are
    # freed one by one during the second: counted whole throughout.
    always = (PARAMS, OPTIM, RUNTIME) + ((ZERO_BUFFERS,) if stage >= 3 else ()) + (PIXELS_KEPT, DEVICE_WINDOW)
    feature_grads = () if recipe.batch.offload_features else (FEATURE_GRADS,)
    across_chunks = GRAD_SUM if components[GRAD_SUM] else GRADS
    encoder = always + (across_chunks, ACTIVATIONS) + feature_grads
    reduction = always + (GRADS,) + (() if stage >= 3 else (ZERO_BUFFERS,)) + feature_grads
    loss = always + (FEATURES, FEATURE_GRADS, LOSS_BUFFERS)
    return GpuMemory(components, {ENCODER_PASS: encoder, REDUCTION: reduction, LOSS: loss})


INPUTS, DECODING, OFFLOADED, PROCESSES = ("input batches", "decoded rows in the decode pool",
                                          "offloaded features + gradients", "process reserve")
# CPU ranks: what a GPU would hold (GpuMemory.allocated_peak) is in host memory.
RANK_TENSORS = "the ranks' tensors (no GPU)"


def host_memory(model: ModelEstimate, recipe: Recipe, world: int, gpus_per_node: int,
                image_bytes: int = DEFAULT_IMAGE_BYTES) -> Dict[str, int]:
    """Bytes per node: every rank's local batches (inputs stay on the host, moved to the GPU
    one chunk at a time: decoded pixels, or the stored images with data.host_batch=encoded,
    `image_bytes` each), the decode pool's window and the rows it keeps between the passes, the
    pinned cached features and their
    gradients with batch.offload_features (pinned blocks stay cached by torch once freed, so
    both count), and a reserve per rank."""
    ranks = min(world, gpus_per_node)
    local = recipe.local_batch(world)
    elem = DTYPE_BYTES[recipe.precision.dtype]
    offloaded = 2 * feature_bytes(local, model.embed_dim, elem) if recipe.batch.offload_features else 0
    held = input_samples_held(recipe.data, local)
    data, chunk = recipe.data, recipe.batch.chunk
    on_host = host_kept_rows(data, local, model.image_size, chunk,
                             kept_pixel_rows(data, local, model.image_size, chunk)) if data.host_batch == "encoded" else 0
    return {INPUTS: ranks * held * sample_host_bytes(data, model.image_size, model.context_length, image_bytes),
            DECODING: ranks * decode_pool_bytes(data, local, model.image_size, on_host),
            OFFLOADED: ranks * offloaded,
            PROCESSES: ranks * HOST_RESERVE_PER_RANK}
