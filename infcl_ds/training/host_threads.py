"""The training process's own CPU threads on a GPU rank: torch's intra-op pool.

torch starts one intra-op thread per core it can see: 64 on a four-GPU host of 64 cores, in each
of the node's training processes, beside the decode processes to which the planner gives every
core of the rank's share but the training process's and the readers' (plan/auto_values.py,
busy_besides_decoding). The training process's host work on a GPU rank is small (assembling the
next local batch, gathering a chunk's tokens), but each such op on more than a few thousand
elements wakes the whole pool, whose threads then spin waiting for more: cores the decode
processes were planned to have, taken from them and from the thread that drives the GPU. So on
a GPU rank the pool gets what the plan leaves the training process: its share of the cores less
the decode processes and the readers' core, at least one.

OMP_NUM_THREADS, where set, wins (the launcher's or the user's choice). CPU ranks compute on the
host and keep torch's default, as does a run whose ZeRO offloads the optimizer to the host (its
Adam step runs on the host, on this pool).
"""
import os
import sys
from typing import Optional, Tuple

import torch

from ..config import Recipe
from ..config.deepspeed_config import build_deepspeed_config
from ..plan.auto_values import busy_besides_decoding, in_words
from ..plan.machine import CoreShare


def planned_threads(recipe: Recipe, share: CoreShare) -> Tuple[int, str]:
    """The intra-op threads the plan leaves a GPU rank's training process (the recipe's
    data.decode_workers resolved), and why, in words."""
    data = recipe.data
    workers = data.decode_workers if isinstance(data.decode_workers, int) else 0
    others = busy_besides_decoding(data)[1:]  # the first is the training process itself
    left = share.cores - workers - sum(n for n, _ in others)
    besides = [f"{workers} decode process{'es' if workers != 1 else ''}"] if workers else []
    besides += [text for _, text in others]
    return max(1, left), f"{share.text}, less {in_words(besides) or 'nothing else'}"


def offloads_optimizer(recipe: Recipe, world: int) -> bool:
    zero = build_deepspeed_config(recipe, world).get("zero_optimization", {})
    return isinstance(zero, dict) and bool(zero.get("offload_optimizer"))


def limit_host_threads(recipe: Recipe, world: int, device: torch.device, share: CoreShare,
                       rank: int) -> Optional[int]:
    """torch's intra-op threads set to planned_threads on a GPU rank (rank 0 says so); None
    (left as they are) on a CPU rank, where OMP_NUM_THREADS is set, or with the optimizer
    offloaded to the host."""
    if device.type != "cuda" or os.environ.get("OMP_NUM_THREADS") or offloads_optimizer(recipe, world):
        return None
    count, why = planned_threads(recipe, share)
    torch.set_num_threads(count)
    if rank == 0:
        print(f"torch threads: {count} per training process ({why}; OMP_NUM_THREADS sets another)",
              file=sys.stderr, flush=True)
    return count
