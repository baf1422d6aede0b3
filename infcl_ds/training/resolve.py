"""The recipe's `auto` values resolved for the device and the node this rank runs on, by the
planner, and what the recipe asks of that device."""
import sys
from typing import Any, Dict, Optional

import deepspeed.comm as dist
import torch

from ..config import Recipe, RecipeError, check_world
from ..data import DataError
from ..data.footprint import gpu_decode_share
from ..data.nvimgcodec_decode import nvimgcodec_module
from ..plan.refusal import PlanError
from ..plan.machine import CoreShare, rank_cores
from ..plan.plan import (AUTO_CHUNK_CPU, AUTO_KEEP_CPU_GIB, AutoDecoder, auto_chunk, auto_decode_workers,
                         auto_decoder, auto_keep_gib, recipe_with, with_decode_workers)


def _gpu_memory_and_count(device: torch.device):
    return torch.cuda.get_device_properties(device).total_memory, max(1, torch.cuda.device_count())


def _rank_share(device: torch.device) -> CoreShare:
    """This rank's share of its node's cores; where no launcher says how many ranks the node
    has, one per visible GPU (how the trainer is launched), one on a CPU rank."""
    return rank_cores(_gpu_memory_and_count(device)[1] if device.type == "cuda" else 1)


def _is_rank_zero(rank: Optional[int]) -> bool:
    """`rank` is 0; None: this process's rank in the job (0 outside one)."""
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
    return rank == 0


def check_float8(recipe: Recipe, device: torch.device) -> None:
    """model.float8 on this rank's device (engine/float8.py says why not): a RecipeError, the same
    on every rank of a uniform job, so raised by all before any collective."""
    from ..engine.float8 import float8_unavailable
    unavailable = float8_unavailable(recipe.model.float8, device)
    if unavailable:
        raise RecipeError(f"recipe: {unavailable}")


def resolve_auto_decoder(recipe: Recipe, world: int, device: torch.device, rank: Optional[int] = None) -> Recipe:
    """The recipe with `data.decoder: auto` replaced by this rank's choice: pil on a CPU rank; on
    a GPU the planner's (plan.auto_decoder: pil where the decode processes of this rank's share of
    the node keep up with its planned step, else hybrid), said once, by rank 0. Before the chunk
    is planned: hybrid's GPU window counts in its peak. Ranks may differ (each decodes its own
    rows); the trainer saves the choice with the run's recipe."""
    if recipe.data.decoder != "auto":
        return recipe
    if device.type != "cuda":
        chosen = AutoDecoder("pil", "no GPU on this rank")
    else:
        check_world(recipe, world)
        try:
            chosen = auto_decoder(recipe, world, *_gpu_memory_and_count(device), _rank_share(device))
        except PlanError as err:
            raise RecipeError(f"recipe: {err}; set data.decoder") from err
    if _is_rank_zero(rank):
        print(f"data.decoder=auto: {chosen.name} ({chosen.why})", file=sys.stderr, flush=True)
    return recipe_with(recipe, "data", decoder=chosen.name)


def resolve_auto_chunk(recipe: Recipe, world: int, device: torch.device, rank: int) -> Recipe:
    """The recipe with `batch.chunk: auto` replaced by the planner's choice for this GPU
    (plan.auto_chunk: the GPU footprints of the engine and the data, no shard opened), the
    smallest over the ranks (GPUs of different sizes in one job); every rank plans the same
    recipe, so all raise alike before the collective. A collective for `auto`: every rank calls
    it. The one place a run asks for the chunk (the trainer; `bench train` as the trainer does):
    build_engine takes the recipe it returns. A numeric chunk comes back as it is."""
    if recipe.batch.chunk != "auto":
        return recipe
    check_world(recipe, world)
    check_float8(recipe, device)
    if device.type == "cuda":
        try:
            # data.decode_workers as this rank resolves it: hybrid's GPU share counts in the peak.
            planned = with_decode_workers(recipe, _rank_share(device))
            chunk = auto_chunk(planned, world, *_gpu_memory_and_count(device))
        except PlanError as err:
            raise RecipeError(f"recipe: {err}; set batch.chunk to a number") from err
    else:
        chunk = min(AUTO_CHUNK_CPU, recipe.local_batch(world))
    if world > 1:
        smallest = torch.tensor([chunk], device=device)  # NCCL takes CUDA tensors, gloo CPU ones
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
        chunk = int(smallest.item())
    if rank == 0:
        print(f"batch.chunk=auto: {chunk} samples per chunk", file=sys.stderr, flush=True)
    return recipe_with(recipe, "batch", chunk=chunk)


def resolve_auto_keep(recipe: Recipe, world: int, device: torch.device) -> Recipe:
    """The recipe with `data.keep_decoded_gib: auto` replaced by the planner's choice for this GPU
    (plan.auto_keep_gib; AUTO_KEEP_CPU_GIB on CPU ranks). Ranks may differ: what a rank keeps
    changes how often it decodes, never its pixels."""
    if recipe.data.keep_decoded_gib != "auto":
        return recipe
    if device.type == "cuda":
        gib = auto_keep_gib(recipe, world, *_gpu_memory_and_count(device))
    else:
        gib = AUTO_KEEP_CPU_GIB
    return recipe_with(recipe, "data", keep_decoded_gib=gib)


def resolve_decode_workers(recipe: Recipe, device: torch.device, rank: Optional[int] = None) -> Recipe:
    """The recipe with `data.decode_workers: auto` replaced by the planner's count for this rank's
    share of its node's cores (plan.auto_decode_workers, machine.rank_cores), said once, by rank
    0 (`rank`; default: this process's rank in the job). Ranks may differ, and a resume may
    choose another count: the processes decide when a row is decoded, never its pixels."""
    if recipe.data.decode_workers != "auto":
        return recipe
    chosen = auto_decode_workers(recipe.data, _rank_share(device))
    if _is_rank_zero(rank):
        print(f"data.decode_workers=auto: {chosen.count} ({chosen.why})", file=sys.stderr, flush=True)
    return recipe_with(recipe, "data", decode_workers=chosen.count)


def check_decoder(recipe: Recipe, device: torch.device) -> None:
    """data.decoder=nvjpeg and hybrid decode on the rank's GPU: refused on a CPU rank, and with
    data.gpu_jpeg_library=nvimgcodec where nvImageCodec is not installed (one line naming the
    extra). The same on every rank of a uniform job: called before any collective."""
    data = recipe.data
    if data.host_batch != "encoded" or data.decoder not in ("nvjpeg", "hybrid"):
        return
    if device.type != "cuda":
        raise DataError(f"data.decoder={data.decoder} decodes on the GPU and this rank runs on {device.type}: "
                        "use data.decoder=pil")
    if data.gpu_jpeg_library == "nvimgcodec":
        nvimgcodec_module()


def resolve_decoder(recipe: Recipe, device: torch.device) -> Recipe:
    """The recipe with hybrid's `data.gpu_decode_share: auto` replaced by its number
    (data.footprint's gpu_decode_share: the measured rates of the GPU and of the decode
    processes), after check_decoder."""
    check_decoder(recipe, device)
    data = recipe.data
    if data.host_batch == "encoded" and data.decoder == "hybrid" and data.gpu_decode_share == "auto":
        return recipe_with(recipe, "data", gpu_decode_share=gpu_decode_share(data))
    return recipe


def resolve_data(recipe: Recipe, world: int, device: torch.device, rank: Optional[int] = None) -> Recipe:
    """The data section's `auto` values for this rank (the recipe saved with the run keeps them:
    a resume resolves them again, on its own node). data.decoder first (the trainer has resolved
    it already, before the chunk), then data.decode_workers: the kept chunks and hybrid's GPU
    share are planned with them."""
    recipe = resolve_decode_workers(resolve_auto_decoder(recipe, world, device, rank), device, rank)
    return resolve_decoder(resolve_auto_keep(recipe, world, device), device)


def resolved_values(recipe: Recipe, resolved: Recipe) -> Dict[str, Any]:
    """{"data.decode_workers": 13, ...}: what this rank made of the data section's `auto` values
    (resolve_data; those it left, as a GPU share without a GPU decoder, left out), for the run's
    record beside the recipe that keeps them."""
    return {f"data.{key}": getattr(resolved.data, key) for key, value in recipe.data
            if value == "auto" and getattr(resolved.data, key) != "auto"}
