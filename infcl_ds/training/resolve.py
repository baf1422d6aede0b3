"""The recipe's `auto` values resolved for the device and the node this rank runs on, by one plan
(plan/auto_values.py: the decoder, decode processes, chunk, kept rows and decode window together),
and what the recipe asks of that device."""
import sys
from typing import Optional

import deepspeed.comm as dist
import torch

from ..config import Recipe, RecipeError, check_world
from ..data import DataError
from ..data.decoding.nvimgcodec_decode import GPU_DECODERS, require_gpu_jpeg_library
from ..plan.machine import host_memory, local_ranks, rank_cores
from ..plan.refusal import PlanError
from ..plan.auto_values import Choice, RankSizes, Resolution, recipe_with, resolve_autos


def check_float8(recipe: Recipe, device: torch.device) -> None:
    """model.float8 on this rank's device (engine/float8.py says why not): a RecipeError, the same
    on every rank of a uniform job, so raised by all before any collective."""
    from ..engine.float8 import float8_unavailable
    unavailable = float8_unavailable(recipe.model.float8, device)
    if unavailable:
        raise RecipeError(f"recipe: {unavailable}")


def check_decoder(recipe: Recipe, device: torch.device) -> None:
    """data.decoder=nvjpeg and hybrid decode on the rank's GPU: refused on a CPU rank, and with
    data.gpu_jpeg_library=nvimgcodec where nvImageCodec is not installed (one line naming the
    extra). The same on every rank of a uniform job: called before any collective."""
    data = recipe.data
    if data.host_batch != "encoded" or data.decoder not in GPU_DECODERS:
        return
    if device.type != "cuda":
        raise DataError(f"data.decoder={data.decoder} decodes on the GPU and this rank runs on {device.type}: "
                        "use data.decoder=pil")
    require_gpu_jpeg_library(data)


def rank_sizes(device: torch.device) -> RankSizes:
    """What this rank's `auto` values depend on: its GPU's memory (0 on a CPU rank), the ranks of
    its node (the launcher's count, else one per visible GPU: how the trainer is launched), its
    share of the node's cores and the node's memory (plan/machine.py)."""
    if device.type == "cuda":
        gpu_bytes = torch.cuda.get_device_properties(device).total_memory
        per_node = local_ranks(max(1, torch.cuda.device_count()))
    else:
        gpu_bytes, per_node = 0, local_ranks(1)
    return RankSizes(gpu_bytes, per_node, rank_cores(per_node), host_memory()[0])


def _resolve(recipe: Recipe, world: int, sizes: RankSizes) -> Resolution:
    try:
        return resolve_autos(recipe, world, sizes)
    except PlanError as err:
        raise RecipeError(f"recipe: {err}; set the value instead of auto") from err


def resolve_recipe(recipe: Recipe, world: int, device: torch.device, rank: int,
                   sizes: Optional[RankSizes] = None) -> Resolution:
    """Every `auto` of the recipe for this rank, from one plan (`sizes`: default, what this rank
    reads off its device and node), checked for this device (float8, the GPU decoder). Raises the
    same RecipeError or DataError on every rank of a uniform job: called before any collective."""
    check_float8(recipe, device)
    check_world(recipe, world)
    resolution = _resolve(recipe, world, sizes or rank_sizes(device))
    check_decoder(resolution.recipe, device)
    return resolution


def agree_on_chunk(recipe: Recipe, resolution: Resolution, world: int, device: torch.device, rank: int,
                   sizes: Optional[RankSizes] = None) -> Resolution:
    """`batch.chunk: auto` the same on every rank: the smallest any rank planned (GPUs of
    different sizes in one job); a rank that planned a larger one plans again with it fixed.
    Then rank 0 says what every `auto` became, in one line. A collective where the recipe's chunk
    is `auto`: every rank calls it."""
    if recipe.batch.chunk == "auto" and world > 1:
        chunk = resolution.recipe.batch.chunk
        smallest = torch.tensor([chunk], device=device)  # NCCL takes CUDA tensors, gloo CPU ones
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
        if int(smallest.item()) != chunk:
            fixed = recipe_with(recipe, "batch", chunk=int(smallest.item()))
            again = _resolve(fixed, world, sizes or rank_sizes(device))
            agreed = Choice("batch.chunk", fixed.batch.chunk, "the smallest any rank planned")
            resolution = Resolution(again.recipe, (agreed,) + again.choices, again.decoding, again.time)
    if rank == 0 and resolution.line():
        print(resolution.line(), file=sys.stderr, flush=True)
    return resolution


def saved_recipe(recipe: Recipe, resolution: Resolution) -> Recipe:
    """The recipe the run saves: the decoder and the chunk as resolved (they shape the run's
    trajectory), the data section's other `auto` values kept (a resume resolves them again, on
    its own node: they decide when a row is decoded, never its pixels)."""
    resolved = resolution.recipe
    return recipe_with(recipe_with(recipe, "data", decoder=resolved.data.decoder), "batch",
                       chunk=resolved.batch.chunk)
