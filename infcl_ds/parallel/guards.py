"""What every loss Function's backward checks first."""
import torch


def refuse_double_backward(loss: str) -> None:
    """Called first in a backward: grad mode is on there only under ``create_graph=True``,
    which asks for gradients of these gradients (not implemented by the tile kernels; the
    gradients returned would be constants, silently wrong for a gradient penalty). Raised on
    every rank alike, before any transfer."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"infcl_ds: double backward (create_graph=True, higher-order gradients) of the "
                           f"{loss} is not supported")
