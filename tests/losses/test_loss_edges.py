"""The loss API's edges (docs/reliability.md): meta features and scales that are not numbers are
value errors, numeric scales of every kind pass, unknown arguments are refused at construction,
and a double backward is refused clearly."""
import pytest
import torch


def _features(device="cpu", n=5, d=7):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, d, generator=g).to(device), torch.randn(n, d, generator=g).to(device))


def test_meta_features_are_a_value_error():
    from infcl_ds import contrastive_loss
    image, text = _features("meta")
    with pytest.raises(ValueError, match="features on device meta; supported: cuda, cpu"):
        contrastive_loss(image, text, 10.0)


@pytest.mark.parametrize("scale", ["100", True, None, [10.0]])
def test_a_scale_that_is_not_a_number_is_a_value_error(scale):
    from infcl_ds import contrastive_loss
    with pytest.raises(ValueError, match="logit_scale must be a number or a tensor"):
        contrastive_loss(*_features(), scale)


def test_numeric_scales_still_pass():
    import numpy as np

    from infcl_ds import contrastive_loss
    image, text = _features()
    want = contrastive_loss(image, text, torch.tensor(10.0))
    for scale in (10, 10.0, np.float32(10.0), np.float64(10.0)):
        assert torch.allclose(contrastive_loss(image, text, scale), want), scale


def test_unknown_loss_arguments_are_refused_at_construction():
    from infcl_ds import ClipLoss, ContrastiveLoss
    with pytest.raises(ValueError, match=r"infcl_ds.ClipLoss: unknown argument\(s\) foo; loss options are"):
        ClipLoss(foo=1)
    with pytest.raises(ValueError, match=r"infcl_ds.ContrastiveLoss: unknown argument\(s\) chek_finite"):
        ContrastiveLoss(chek_finite=False)
    ClipLoss(check_finite=False, backend="torch")  # the real options pass


def test_double_backward_is_refused_clearly():
    from infcl_ds import contrastive_loss
    image, text = (t.requires_grad_() for t in _features())
    loss = contrastive_loss(image, text, 10.0)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        torch.autograd.grad(loss, image, create_graph=True)
    # First-order gradients are untouched.
    loss = contrastive_loss(image, text, 10.0)
    (grad,) = torch.autograd.grad(loss, image)
    assert grad.shape == image.shape and torch.isfinite(grad).all()
