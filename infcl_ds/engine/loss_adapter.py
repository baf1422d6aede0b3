"""What the engine needs from a loss: one call, ``adapter(image, text, scale, bias, group)``,
and whether the model's ``logit_bias`` takes part (then the engine trains it like the scale).
A loss is picked by name from ADAPTERS (the recipe's ``model.loss``)."""
import dataclasses
from typing import Callable, Optional, Union

import torch

from ..losses import contrastive_loss, sigmoid_loss


@dataclasses.dataclass(frozen=True)
class LossAdapter:
    """loss: the global loss, ``loss(image, text, scale, group)``, or with ``uses_bias``
    ``loss(image, text, scale, bias, group)``. wrong_model: the error for a model whose
    ``logit_bias`` (present or absent) does not fit this loss."""
    name: str
    loss: Callable
    uses_bias: bool
    wrong_model: str

    def __call__(self, image, text, scale, bias: Optional[torch.Tensor], group) -> torch.Tensor:
        scalars = (scale, bias) if self.uses_bias else (scale,)
        return self.loss(image, text, *scalars, group)


ADAPTERS = {
    "clip": LossAdapter("clip", contrastive_loss, uses_bias=False,
                        wrong_model="this model has a logit_bias (a SigLIP model): train it with loss='siglip' "
                                    "(recipe key model.loss)"),
    "siglip": LossAdapter("siglip", sigmoid_loss, uses_bias=True,
                          wrong_model="the sigmoid loss needs a model with a logit_bias "
                                      "(create_model(name, loss='siglip'))"),
}


def loss_adapter(loss: Union[str, LossAdapter], loss_fn: Optional[Callable] = None) -> LossAdapter:
    """``loss``: an adapter or a name in ADAPTERS. ``loss_fn``: another function in place of
    that loss's, with its signature (benchmarks and tests swap in other implementations)."""
    adapter = loss if isinstance(loss, LossAdapter) else ADAPTERS.get(loss)
    if adapter is None:
        raise ValueError(f"loss must be one of {tuple(ADAPTERS)} or a LossAdapter, got {loss!r}")
    return adapter if loss_fn is None else dataclasses.replace(adapter, loss=loss_fn)
