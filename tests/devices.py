"""Where the tests run: the CPU (default; Triton kernels through TRITON_INTERPRET=1, gloo ranks)
or, with INFCL_DS_TEST_DEVICE=cuda (`bash tests/run.sh --gpu`), CUDA: the kernels compiled,
bf16 on the tensor cores, NCCL ranks one GPU each.

On CUDA the references stay exact: fp32 inputs use IEEE fp32 products (EXACT, allow_tf32=False,
whatever the process's float32 matmul precision: TF32 is ~1e-3, beyond the fp32 tolerances) and
cuDNN's TF32 convolutions are off."""
import functools
import os

import pytest
import torch

GPU = os.environ.get("INFCL_DS_TEST_DEVICE", "cpu") == "cuda"
DEVICE = torch.device("cuda" if GPU else "cpu")
DIST_BACKEND = "nccl" if GPU else "gloo"
EXACT = {"allow_tf32": False} if GPU else {}


def exact_loss(loss: str = "clip"):
    """The engine's loss ("clip" or "siglip") with IEEE fp32 products, whatever the float32
    matmul precision."""
    from infcl_ds import contrastive_loss, sigmoid_loss
    return functools.partial({"clip": contrastive_loss, "siglip": sigmoid_loss}[loss], **EXACT)


def cpu_only(why: str):
    """For a test of a gpu-marked file that checks CPU-side behaviour only (gloo's fault
    handling, a CPU program in subprocesses): skipped under --gpu, saying why."""
    return pytest.mark.skipif(GPU, reason=f"CPU only: {why}")


def setup_rank(rank: int) -> None:
    """Per spawned rank on CUDA: its own GPU, exact fp32 convolutions."""
    if GPU:
        torch.cuda.set_device(rank)
        torch.backends.cudnn.allow_tf32 = False
