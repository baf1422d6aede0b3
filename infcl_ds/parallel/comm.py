"""The collectives library the ring calls: deepspeed.comm when DeepSpeed set up the process
group, torch.distributed otherwise.

Under DeepSpeed the ring's traffic goes through deepspeed.comm, so that its comms logger and
accelerator abstraction see it. A program that created its own process group with
torch.distributed (OpenCLIP's trainer using the ClipLoss drop-in) gets torch.distributed
directly: initialising deepspeed.comm there would import DeepSpeed, print its accelerator
warnings and, on CPU, JIT-build its shared-memory op (a compiler run of tens of seconds).
Both modules take the same calls: P2POp(isend/irecv, ...), batch_isend_irecv, all_reduce,
ReduceOp, all_gather_object.
"""
import sys

import torch.distributed as torch_dist


def comm_library():
    """deepspeed.comm if it is initialised (checked without importing DeepSpeed), else
    torch.distributed."""
    deepspeed_comm = sys.modules.get("deepspeed.comm")
    if deepspeed_comm is not None and deepspeed_comm.is_initialized():
        return deepspeed_comm
    return torch_dist


# DeepSpeed's name for its CPU shared-memory all-reduce op (op_builder/cpu/comm.py).
_SHM_OP = "deepspeed_shm_comm"


def without_cpu_shared_memory_op() -> None:
    """Call before ``deepspeed.init_distributed`` on CPU ranks: DeepSpeed is told its CPU
    shared-memory op is unavailable, so gloo carries every collective. DeepSpeed (0.19.8) would
    otherwise JIT-compile that op at a first start (minutes on a 2-core machine) for its
    inference all-reduce, which training never calls, and, under its launcher, create two
    66 MB buffers per rank in /dev/shm that nothing unlinks (its `shared_close` is never
    called): each local CPU job leaves them in memory until the machine runs out."""
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__[_SHM_OP] = False
