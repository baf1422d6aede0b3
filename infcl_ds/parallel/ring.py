"""Neighbour exchange over deepspeed.comm: send to rank+1, receive from rank-1 in a group.

The ring follows the group's rank order. With the launcher's node-major numbering, all
hops but one per node stay inside a node (NVLink), so the inter-node links carry one block
per node per step. `P2POp` peers are *global* ranks: the group's order is mapped here once.
"""
from typing import List, Sequence

import torch
import torch.distributed as torch_dist
from deepspeed import comm as dist

TIMEOUT_HINT = ("A peer process died or raised; see its log. Waits are bounded by the process group's "
                "timeout: deepspeed.init_distributed(timeout=timedelta(...)) or DEEPSPEED_TIMEOUT.")


def ensure_deepspeed_comm() -> None:
    """Let deepspeed.comm drive a process group that the user created with torch.distributed."""
    if not dist.is_initialized():
        dist.init_distributed(dist_backend=torch_dist.get_backend(), auto_mpi_discovery=False, verbose=False)


class RingError(RuntimeError):
    """A ring transfer failed: a peer is gone or stuck."""


class Ring:
    """Positions of this process in ``group`` and the two neighbours' global ranks."""

    def __init__(self, group=None):
        ensure_deepspeed_comm()
        self.group = group if group is not None else torch_dist.group.WORLD
        self.ranks: List[int] = torch_dist.get_process_group_ranks(self.group)
        self.size = len(self.ranks)
        self.rank = torch_dist.get_rank()
        self.pos = self.ranks.index(self.rank)
        self.next = self.ranks[(self.pos + 1) % self.size]
        self.prev = self.ranks[(self.pos - 1) % self.size]

    @property
    def device(self) -> torch.device:
        """Where this group's collectives take their tensors."""
        if torch_dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def origin(self, step: int) -> int:
        """Group position whose block this rank holds at ``step`` (blocks move to rank+1)."""
        return (self.pos - step) % self.size

    def start(self, sends: Sequence[torch.Tensor] = (), recvs: Sequence[torch.Tensor] = (), tag: int = 0):
        """Post sends to the next rank and receives from the previous one; return the requests.

        Each side posts its messages in the same order (NCCL matches in order per peer;
        gloo matches by tag, so every message kind gets its own tag)."""
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag + i) for i, t in enumerate(sends)]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag + i) for i, t in enumerate(recvs)]
        return dist.batch_isend_irecv(ops) if ops else []

    def wait(self, requests, what: str, step: int) -> None:
        try:
            for req in requests:
                req.wait()
        except Exception as err:  # gloo: RuntimeError; NCCL: DistBackendError
            raise RingError(f"infcl_ds ring: rank {self.rank} (position {self.pos} of {self.size}) failed while "
                            f"exchanging {what} at step {step} with ranks {self.prev} -> {self.rank} -> {self.next}: "
                            f"{err}. {TIMEOUT_HINT}") from err

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        except Exception as err:
            raise RingError(f"infcl_ds ring: rank {self.rank} failed in the all-reduce: {err}. {TIMEOUT_HINT}") from err
        return tensor
