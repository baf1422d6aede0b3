"""Reading checkpoints without running code from them.

A ``.pt`` file is a pickle, and unpickling can call any function the file names: a
checkpoint pulled from a bucket or shared by a colleague could run a shell. Every checkpoint
file this project reads, its own and DeepSpeed's, is therefore loaded with
``torch.load(weights_only=True)``, whose unpickler builds only tensors, containers, numbers
and strings, plus the few DeepSpeed classes listed in ``DEEPSPEED_SAFE_GLOBALS``: plain data
holders (a loss scaler's counters, a ZeRO stage enum, a fragment's offsets) that DeepSpeed
pickles into its optimizer states. Building them sets attributes; it runs none of their code.

DeepSpeed's own readers (``engine.load_checkpoint``, ``zero_to_fp32``) call
``torch.load(weights_only=False)``; ``deepspeed_reads_weights_only()`` routes those calls
through ``load_weights_only`` for as long as it is active.

A file that needs anything else is refused with a ``CheckpointError`` naming it and the
type it asked for. ``--trust-checkpoint`` (train, export, eval) reads such a file with the
plain unpickler: only for a checkpoint whose origin you trust.
"""
import contextlib
import pickle
from pathlib import Path

import torch

TRUST_FLAG = "--trust-checkpoint"
TRUST_HELP = ("read checkpoint files with Python's full unpickler, which can run code stored in them: only for a "
              "checkpoint you trust. By default every file is read with torch.load(weights_only=True) "
              "(docs/reliability.md)")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used as it is; the message names the file or tag."""


def deepspeed_safe_globals() -> list:
    """The classes DeepSpeed 0.19 pickles into its checkpoint files (ZeRO 1-3, fp32 and bf16)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_weights_only(path, map_location="cpu", mmap=None):
    """``torch.load`` that builds data only; a file asking for anything else is refused."""
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        try:
            # torch.serialization.load: torch.load itself is replaced while DeepSpeed reads.
            return torch.serialization.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as err:
            detail = next((line.strip() for line in str(err).splitlines() if "Unsupported" in line),
                          str(err).splitlines()[0] if str(err) else type(err).__name__)
            raise CheckpointError(f"checkpoint file {path} refused: it asks the unpickler for more than tensors "
                                  f"and data ({detail}); loading it could run code. If you trust its origin, "
                                  f"pass {TRUST_FLAG}") from None
        # Whatever else a file can make the reader raise: a damaged archive, or an allowed class
        # called with arguments it does not take (a TypeError from its constructor).
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"checkpoint file {path} cannot be read (truncated or damaged?): "
                                  f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None


@contextlib.contextmanager
def deepspeed_reads_weights_only(trust: bool = False):
    """While active, ``torch.load`` (as DeepSpeed's checkpoint readers call it) is
    ``load_weights_only``; with ``trust`` nothing changes."""
    if trust:
        yield
        return
    original = torch.load

    def weights_only_load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **_):
        return load_weights_only(f if not isinstance(f, Path) else str(f), map_location=map_location, mmap=mmap)

    torch.load = weights_only_load
    try:
        yield
    finally:
        torch.load = original
