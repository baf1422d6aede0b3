"""The float64 references over the full B x B logits, and the error measure, shared by the
benchmarks' self-checks and the tests (which import them from here; the package never does)."""
import torch
import torch.nn.functional as F


def full_logits_loss(image, text, scale):
    """The textbook bidirectional CLIP loss over the B x B logits (OpenCLIP's ClipLoss on one
    device), in the inputs' dtype."""
    logits = scale * image @ text.T
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def full_logits_sigmoid_loss(image, text, scale, bias):
    """The sigmoid (SigLIP) loss over the B x B logits, in the inputs' dtype."""
    logits = scale * image @ text.T + bias
    z = 2 * torch.eye(image.shape[0], dtype=logits.dtype, device=image.device) - 1
    return -F.logsigmoid(z * logits).sum() / image.shape[0]


def float64_reference(loss_fn, image, text, *scalars):
    """``loss_fn``'s loss and its gradients to the features and each scalar (scale, bias), in
    float64 on the same (rounded) inputs."""
    inputs = [x.detach().double().requires_grad_() for x in (image, text)]
    inputs += [s.detach().double().reshape(()).requires_grad_() for s in scalars]
    loss = loss_fn(*inputs)
    loss.backward()
    return (loss.detach(), *(x.grad for x in inputs))


def clip_loss_reference(image, text, scale):
    """Loss and (d_image, d_text, d_scale) of the CLIP loss in float64."""
    return float64_reference(full_logits_loss, image, text, scale)


def siglip_loss_reference(image, text, scale, bias):
    """Loss and (d_image, d_text, d_scale, d_bias) of the sigmoid loss in float64."""
    return float64_reference(full_logits_sigmoid_loss, image, text, scale, bias)


def rel_err(x, ref) -> float:
    """Norm-wise relative error (against 1e-12 where the reference is numerically zero)."""
    x, ref = x.detach().cpu().double().reshape(-1), ref.detach().cpu().double().reshape(-1)
    return ((x - ref).norm() / max(ref.norm().item(), 1e-12)).item()


def reference_steps(model, loss_of, opt_cls, lr, steps):
    """The parameters after ``steps`` plain steps of ``opt_cls`` on ``loss_of(model)``, the
    logit scale clamped at log(100) after each as the engine and open_clip do."""
    import math
    opt = opt_cls(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss_of(model).backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(max=math.log(100.0))
    return {n: p.detach().clone() for n, p in model.named_parameters()}
