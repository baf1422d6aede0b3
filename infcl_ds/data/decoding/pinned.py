"""Host tensors the GPU copies from asynchronously: page-locked, of exactly their size.

torch's pinned allocator rounds every allocation up to a power of two (its caching size
classes), so a 74 GiB local batch would lock 128 GiB. These are ordinary host allocations
registered with CUDA (cudaHostRegister) for exactly their bytes and unregistered when the
tensor is collected. Without CUDA they are plain host tensors.
"""
import weakref

import torch

# cudaHostRegisterPortable: page-locked for every CUDA context, so registering from the
# data thread serves the rank's device whatever that thread's current device.
_PORTABLE = 1


def register_pinned(tensor: torch.Tensor) -> bool:
    """Page-lock `tensor`'s host memory for as long as the tensor lives (True), or leave it
    pageable where CUDA is absent or refuses (e.g. a memlock limit: False)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0 or not torch.cuda.is_available():
        return False
    cudart = torch.cuda.cudart()
    ptr = tensor.data_ptr()
    if int(cudart.cudaHostRegister(ptr, nbytes, _PORTABLE)) != 0:
        return False
    # The base tensor dies no later than its storage (views hold the storage, not the base),
    # so the pages are unlocked before they are freed.
    weakref.finalize(tensor, cudart.cudaHostUnregister, ptr)
    return True


def pinned_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.empty(shape, dtype=dtype)
    if tensor.numel() == 0 or not torch.cuda.is_available() or register_pinned(tensor):
        return tensor
    # Could not lock these pages: torch's own pinned memory, rounded.
    return torch.empty(shape, dtype=dtype, pin_memory=True)
