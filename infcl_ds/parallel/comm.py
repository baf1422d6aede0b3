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
