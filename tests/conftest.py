"""Test-wide settings. The Triton kernels run on CPU tensors through Triton's interpreter,
which must be switched on before any kernel is defined (it is read when @triton.jit runs)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
