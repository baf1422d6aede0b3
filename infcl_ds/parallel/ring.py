"""Neighbour exchange: send to rank+1, receive from rank-1 in a group (over deepspeed.comm
under DeepSpeed, torch.distributed otherwise: see comm.py).

The ring follows the group's rank order. With the launcher's node-major numbering, all
hops but one per node stay inside a node (NVLink), so the inter-node links carry one block
per node per step. `P2POp` peers are *global* ranks: the group's order is mapped here once.
"""
from typing import List, Sequence, Tuple

import torch
import torch.distributed as torch_dist

from ..ops.layout import as_row_major
from .comm import comm_library

TIMEOUT_HINT = ("A peer process died or raised; see its log. Waits are bounded by the process group's "
                "timeout: deepspeed.init_distributed(timeout=timedelta(...)) or DEEPSPEED_TIMEOUT.")


class RingError(RuntimeError):
    """A ring transfer failed: a peer is gone or stuck."""


def is_collective_failure(err: BaseException) -> bool:
    """A failed or timed-out collective (gloo, NCCL or the ring) rather than a bug here."""
    if isinstance(err, RingError) or type(err).__name__ in ("DistError", "DistBackendError", "DistNetworkError"):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        word in text for word in ("Timed out", "timed out", "Connection closed by peer", "Connection reset", "gloo"))


def group_size(group=None) -> int:
    """Ranks in ``group`` (None: the default group); 1 without torch.distributed, where a
    group given is a ValueError."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 1
    return torch_dist.get_world_size(group)


class LocalRing:
    """The ring of one rank: a single device, no process group (the loss Functions take it
    where they would take a Ring; they move nothing when ``size == 1``)."""
    size, pos = 1, 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class Ring:
    """Positions of this process in ``group`` and the two neighbours' global ranks."""

    def __init__(self, group=None):
        self.comm = comm_library()
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
        comm = self.comm
        ops = [comm.P2POp(comm.isend, t, self.next, self.group, tag + i) for i, t in enumerate(sends)]
        ops += [comm.P2POp(comm.irecv, t, self.prev, self.group, tag + i) for i, t in enumerate(recvs)]
        return comm.batch_isend_irecv(ops) if ops else []

    def wait(self, requests, what: str, step: int) -> None:
        try:
            for req in requests:
                req.wait()
        except Exception as err:  # gloo: RuntimeError; NCCL: DistBackendError
            raise RingError(f"infcl_ds ring: rank {self.rank} (position {self.pos} of {self.size}) failed while "
                            f"exchanging {what} at step {step} with ranks {self.prev} -> {self.rank} -> {self.next}: "
                            f"{err}. {TIMEOUT_HINT}") from err

    def relay_partial(self, out: torch.Tensor, grad_in: torch.Tensor, sizes: Sequence[int], step: int,
                      pending, tag: int):
        """The travelling text gradient, one hop: wait for the partial of the block this rank
        holds at ``step`` (it arrives in ``grad_in``), add it to this rank's share ``out``, and
        send the sum on to rank+1 (home after the last step) while the next partial is received
        into ``grad_in``, which was read just above. Returns the new requests."""
        self.wait(pending, "text gradient", step)
        if step > 0:
            out += grad_in[:sizes[self.origin(step)]]
        last = step == self.size - 1
        target = grad_in[:sizes[self.pos if last else self.origin(step + 1)]]
        return self.start([out], [target], tag)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            self.comm.all_reduce(tensor, op=self.comm.ReduceOp.SUM, group=self.group)
        except Exception as err:
            raise RingError(f"infcl_ds ring: rank {self.rank} failed in the all-reduce: {err}. {TIMEOUT_HINT}") from err
        return tensor


def ring_blocks(image: torch.Tensor, text: torch.Tensor, ring) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's features as a loss Function keeps them from its forward to its backward:
    row-major for the kernels and GEMMs (ops/layout.py), and the texts contiguous when they
    travel (W > 1: NCCL and gloo send only contiguous tensors; a row slice x[::2] is row-major
    but not contiguous). Each is a copy only when needed: contiguous features, the usual
    case, are returned as they are."""
    text = text.contiguous() if ring.size > 1 else as_row_major(text)
    return as_row_major(image), text
