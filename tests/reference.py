"""Float64 full-logit reference of the bidirectional CLIP loss, and error measures."""
import torch
import torch.nn.functional as F

from devices import DEVICE


def full_logits_loss(image, text, scale):
    """The textbook bidirectional CLIP loss over the B x B logits."""
    logits = scale * image @ text.T
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def clip_loss_reference(image, text, scale):
    """Loss and (d_image, d_text, d_scale) in float64 on the same (rounded) inputs."""
    image = image.detach().double().requires_grad_()
    text = text.detach().double().requires_grad_()
    scale = scale.detach().double().reshape(()).requires_grad_()
    loss = full_logits_loss(image, text, scale)
    loss.backward()
    return loss.detach(), image.grad, text.grad, scale.grad


def rel_err(x, ref) -> float:
    """Norm-wise relative error; absolute where the reference is (numerically) zero."""
    x, ref = x.detach().cpu().double().reshape(-1), ref.detach().cpu().double().reshape(-1)
    return ((x - ref).norm() / max(ref.norm().item(), 1e-12)).item()


def random_features(n, d, dtype, seed, normalise=True):
    """The same values on every device (drawn on the CPU), on the test device (devices.py)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, device="cpu")
    if normalise:
        x = F.normalize(x, dim=1)
    return x.to(DEVICE, dtype)


def siglip_loss_reference(image, text, scale, bias):
    """Sigmoid loss and (d_image, d_text, d_scale, d_bias) in float64 over the B x B logits."""
    image = image.detach().double().requires_grad_()
    text = text.detach().double().requires_grad_()
    scale = scale.detach().double().reshape(()).requires_grad_()
    bias = bias.detach().double().reshape(()).requires_grad_()
    logits = scale * image @ text.T + bias
    z = 2 * torch.eye(image.shape[0], dtype=torch.float64, device=image.device) - 1
    loss = -F.logsigmoid(z * logits).sum() / image.shape[0]
    loss.backward()
    return loss.detach(), image.grad, text.grad, scale.grad, bias.grad
