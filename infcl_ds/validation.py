"""Input checks for the public loss: every bad input is a ValueError that names the problem;
values that cannot give a finite loss are its subclass NonFiniteFeaturesError."""
import numbers
from typing import Optional

import torch

FEATURE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FEATURE_DEVICES = ("cuda", "cpu")


class NonFiniteFeaturesError(ValueError):
    """Inputs that cannot give a finite loss: features, logit scale or bias holding NaN or Inf,
    or features too large for finite fp32 logits. A ValueError like every bad input; a type of
    its own so that a trainer tells a diverged step from a caller's mistake (training/divergence.py)
    without reading the message. ``problem``: what is wrong, without the advice to API callers
    that the message ends with (the whole message where it has none). Over several ranks every
    rank raises it when each failing rank's problem is one (parallel/checks.py)."""

    def __init__(self, message: str, problem: Optional[str] = None):
        super().__init__(message)
        self.problem = message if problem is None else problem

    def __reduce__(self):  # pickled (a spawned rank's result): the problem too
        return type(self), (str(self), self.problem)


def _nonfinite(problem: str, advice: str = " (pass check_finite=False to skip this check)") -> NonFiniteFeaturesError:
    return NonFiniteFeaturesError(problem + advice, problem)


def check_features(image: torch.Tensor, text: torch.Tensor, logit_scale, check_finite: bool = True) -> torch.Tensor:
    """Validate the loss inputs; return logit_scale as a 1-element tensor on the features' device."""
    for name, t in (("image_features", image), ("text_features", text)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D [batch, dim], got shape {tuple(t.shape)}")
        if t.layout != torch.strided:
            raise ValueError(f"{name} is a {t.layout} tensor; pass dense features ({name}.to_dense())")
        if t.dtype not in FEATURE_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; supported: float32, bfloat16, float16")
    if image.shape[0] != text.shape[0]:
        raise ValueError(f"batch mismatch: image_features has {image.shape[0]} rows, text_features {text.shape[0]}")
    if image.shape[1] != text.shape[1]:
        raise ValueError(f"width mismatch: image_features has dim {image.shape[1]}, text_features {text.shape[1]}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"empty features: shape {tuple(image.shape)}")
    if image.device != text.device:
        raise ValueError(f"device mismatch: image_features on {image.device}, text_features on {text.device}")
    if image.device.type not in FEATURE_DEVICES:  # meta tensors have no values to compute with
        raise ValueError(f"features on device {image.device}; supported: {', '.join(FEATURE_DEVICES)}")
    if image.dtype != text.dtype:
        raise ValueError(f"dtype mismatch: image_features {image.dtype}, text_features {text.dtype}")
    logit_scale = as_scalar_tensor("logit_scale", logit_scale, image.device)
    if check_finite:
        # A few reductions and one host sync: far cheaper than the loss itself, and a NaN
        # caught here names its source instead of surfacing as a NaN loss later.
        peaks = [torch.aminmax(t.detach()) for t in (image, text)]
        checks = torch.stack([~torch.isfinite(image).all(), ~torch.isfinite(text).all(),
                              ~torch.isfinite(logit_scale.detach()).all(),
                              *[torch.maximum(-low, high).float() for low, high in peaks],
                              logit_scale.detach().float().abs().reshape(())]).tolist()
        for name, is_bad in zip(("image_features", "text_features", "logit_scale"), checks[:3]):
            if is_bad:
                raise _nonfinite(f"{name} contains NaN or Inf")
        check_logits_fit(*checks[3:], image.shape[1])
    return logit_scale


# The logits are summed in fp32 (whatever the features' dtype): their magnitude must stay below
# its largest finite value, or the loss is Inf/NaN.
FP32_MAX = torch.finfo(torch.float32).max


def check_logits_fit(image_peak: float, text_peak: float, scale: float, dim: int) -> None:
    """Every logit s x.y is at most s * dim * max|x| * max|y| in magnitude; past fp32's range
    the loss could not be exact, so such features are refused instead of returning NaN."""
    bound = scale * dim * image_peak * text_peak
    if bound >= FP32_MAX:
        raise _nonfinite(f"features too large for finite logits: |logit_scale| x dim x max|image_features| x "
                         f"max|text_features| = {bound:.3g} reaches float32's {FP32_MAX:.3g}",
                         " (L2-normalise the features)")


def as_scalar_tensor(name: str, value, device: torch.device) -> torch.Tensor:
    """A number or 1-element floating tensor on ``device`` as a tensor (ValueError otherwise)."""
    if not isinstance(value, torch.Tensor):
        # A real number only: float() would also take the string "100" and True. A ValueError,
        # like every other bad input: raised on every rank.
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or type(value).__name__ == "bool_":
            raise ValueError(f"{name} must be a number or a tensor, got {type(value).__name__} {value!r}")
        value = torch.tensor(float(value), device=device)
    if value.numel() != 1:
        raise ValueError(f"{name} must be a 0-dim or 1-element tensor, got shape {tuple(value.shape)}")
    if not value.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"device mismatch: {name} on {value.device}, features on {device}")
    return value


def check_logit_bias(logit_bias, device: torch.device, check_finite: bool = True) -> torch.Tensor:
    """Validate the sigmoid loss's bias like the scale; return it as a tensor on ``device``."""
    logit_bias = as_scalar_tensor("logit_bias", logit_bias, device)
    _check_finite_bias(logit_bias, check_finite)
    return logit_bias


def check_unused_logit_bias(logit_bias, check_finite: bool = True) -> None:
    """The CLIP loss's optional bias (OpenCLIP's ClipLoss takes one): a scalar adds the same
    constant to every logit and cancels in each softmax, so it is never read, but a bad one is
    still refused like any other input. None (no bias), or a real number or 1-element tensor
    on any device, finite unless check_finite is False."""
    if logit_bias is None:
        return
    if isinstance(logit_bias, torch.Tensor):
        if logit_bias.numel() != 1:
            raise ValueError(f"logit_bias must be a scalar (it cancels in the softmax), got shape "
                             f"{tuple(logit_bias.shape)}")
    elif not isinstance(logit_bias, numbers.Real) or isinstance(logit_bias, bool):
        raise ValueError(f"logit_bias must be a scalar (it cancels in the softmax), got "
                         f"{type(logit_bias).__name__} {logit_bias!r}")
    else:
        logit_bias = torch.tensor(float(logit_bias))
    _check_finite_bias(logit_bias, check_finite)


def _check_finite_bias(logit_bias: torch.Tensor, check_finite: bool) -> None:
    if check_finite and not bool(torch.isfinite(logit_bias.detach()).all()):
        raise _nonfinite("logit_bias contains NaN or Inf")
