"""What every public loss does before its autograd Function: build the options, validate the
inputs, agree on them across the ranks, then apply the Function over the ring."""
import inspect
from typing import Optional, Tuple

import torch

from ..ops.options import KernelOptions, tf32_by_default
from ..parallel import LocalRing, Ring, check_across_ranks, group_size
from ..validation import check_features, check_logit_bias, check_unused_logit_bias


def kernel_options(backend: str, allow_tf32: Optional[bool], g_tile: Optional[Tuple[int, int]]) -> KernelOptions:
    """allow_tf32=None follows PyTorch's setting (``tf32_by_default``). g_tile: (columns,
    rows) of the backward's G tiles, for tests only (None: derived from memory)."""
    panel, panel_rows = g_tile or (None, None)
    return KernelOptions(backend=backend, allow_tf32=tf32_by_default() if allow_tf32 is None else allow_tf32,
                         panel=panel, panel_rows=panel_rows)


def apply_loss(function, name: str, image, text, logit_scale, logit_bias, group, options: KernelOptions,
               check_finite: bool) -> torch.Tensor:
    """``function`` (ClipLossFunction, SigLipLossFunction) of the batch spread over ``group``.

    logit_bias is read only by a Function that ``takes_bias``; given to one that does not
    (OpenCLIP's ClipLoss passes its bias to the CLIP loss, where it cancels), it is checked
    all the same (check_unused_logit_bias). Over several ranks, local problems are shared
    before any rank raises, so that no peer is left waiting in the ring; every rank then
    raises the same ValueError, prefixed with ``name`` (a NonFiniteFeaturesError where every
    failing rank's was one, as on one rank)."""
    def validated():
        scale = check_features(image, text, logit_scale, check_finite)
        if not function.takes_bias:
            check_unused_logit_bias(logit_bias, check_finite)
            return (scale,)
        return scale, check_logit_bias(logit_bias, image.device, check_finite)

    if group_size(group) == 1:
        return function.apply(image, text, *validated(), options, LocalRing(), [image.shape[0]])
    ring = Ring(group)
    try:
        scalars, error = validated(), None
    except ValueError as err:  # NonFiniteFeaturesError too: its type reaches every rank
        scalars, error = (torch.zeros(()),) * (2 if function.takes_bias else 1), err
    bias = scalars[1] if function.takes_bias else None
    sizes = check_across_ranks(ring, image, text, scalars[0], error, bias=bias, loss_name=name)
    return function.apply(image, text, *scalars, options, ring, sizes)


def check_loss_options(options: dict, owner: str, loss, error=ValueError) -> None:
    """Keyword options for ``loss`` given at a module's construction: an unknown one is an
    ``error`` there, not a TypeError at the first forward. Options whose names start with an
    underscore (tests only) pass but are not listed."""
    params = inspect.signature(loss).parameters.items()
    known = [name for name, p in params if p.kind == p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        public = [name for name in known if not name.startswith("_")]
        raise error(f"{owner}: unknown argument(s) {', '.join(unknown)}; loss options are {', '.join(public)}")
