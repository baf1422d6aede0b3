"""Test-wide settings. On the CPU (the default) the Triton kernels run on CPU tensors through
Triton's interpreter, which must be switched on before any kernel is defined (it is read when
@triton.jit runs), and DeepSpeed uses its CPU accelerator. With INFCL_DS_TEST_DEVICE=cuda
(`bash tests/run.sh --gpu`, tests/devices.py) neither is set: the kernels are compiled."""
import os

if os.environ.get("INFCL_DS_TEST_DEVICE", "cpu") == "cuda":
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("INFCL_DS_TEST_DEVICE=cuda runs the compiled kernels: unset TRITON_INTERPRET")
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _kernel_tests_on_the_test_device(request):
    """Under --gpu the kernel tests' tensors (made by torch factories) live on CUDA."""
    from devices import GPU
    if not (GPU and request.module.__name__ in ("test_ops", "test_loss")):
        yield
        return
    import torch
    torch.set_default_device("cuda")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.fixture(autouse=True)
def _train_data_closed_after_each_test(monkeypatch):
    """Each TrainData a test builds is closed when the test ends: its worker pools stop then,
    not whenever a later test happens to run the garbage collector (sampler.stop_workers)."""
    import sys
    train = sys.modules.get("infcl_ds.data.train_stream")  # imported by the test module if it uses data
    if train is None:
        yield
        return
    built, init = [], train.TrainData.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)
    monkeypatch.setattr(train.TrainData, "__init__", recording_init)
    yield
    for data in built:
        data.close()


@pytest.fixture(autouse=True)
def _environment_as_the_test_found_it():
    """Each test leaves os.environ as it found it. The CLIs called in this process set variables
    for the rest of their process (train's PYTORCH_CUDA_ALLOC_CONF, NCCL's watchdog settings),
    which would otherwise reach the ranks every later test spawns."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)
