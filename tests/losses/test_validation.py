"""Bad input is a ValueError that names the problem, never a silent NaN."""
import pytest
import torch

from infcl_ds import contrastive_loss


def feats(n=4, d=8, dtype=torch.float32):
    return torch.randn(n, d, dtype=dtype), torch.randn(n, d, dtype=dtype)


@pytest.mark.parametrize("make,match", [
    (lambda: (torch.randn(4, 8), torch.randn(5, 8), torch.tensor(1.0)), "batch mismatch"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 9), torch.tensor(1.0)), "width mismatch"),
    (lambda: (torch.randn(4, 8, 1), torch.randn(4, 8), torch.tensor(1.0)), "must be 2-D"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8).double(), torch.tensor(1.0)), "dtype"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8).bfloat16(), torch.tensor(1.0)), "dtype mismatch"),
    (lambda: (torch.randn(0, 8), torch.randn(0, 8), torch.tensor(1.0)), "empty"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.ones(2)), "logit_scale must be a 0-dim"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.tensor(3)), "floating point"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.tensor(float("nan"))), "logit_scale contains NaN"),
    (lambda: (torch.randn(4, 8).index_fill_(0, torch.tensor([2]), float("nan")), torch.randn(4, 8), torch.tensor(1.0)),
     "image_features contains NaN"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8).index_fill_(0, torch.tensor([1]), float("inf")), torch.tensor(1.0)),
     "text_features contains NaN or Inf"),
    (lambda: ([[1.0]], torch.randn(1, 1), torch.tensor(1.0)), "must be a torch.Tensor"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), None), "logit_scale must be a number or a tensor, got NoneType"),
])
def test_bad_input_raises_named_error(make, match):
    image, text, scale = make()
    with pytest.raises(ValueError, match=match):
        contrastive_loss(image, text, scale)


def test_finite_check_can_be_skipped():
    image, text = feats()
    image[0, 0] = float("nan")
    loss = contrastive_loss(image, text, torch.tensor(1.0), check_finite=False, backend="torch")
    assert torch.isnan(loss)


def test_unknown_backend():
    image, text = feats()
    with pytest.raises(ValueError, match="backend must be one of"):
        contrastive_loss(image, text, torch.tensor(1.0), backend="cuda")


def test_group_without_distributed():
    image, text = feats()
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        contrastive_loss(image, text, torch.tensor(1.0), group=object())


def test_sparse_features_and_logits_past_float32_are_value_errors():
    """A sparse tensor was a NotImplementedError from inside the kernels; features of 1e19
    returned a NaN loss although each value is finite."""
    import torch
    from infcl_ds import contrastive_loss
    x = torch.nn.functional.normalize(torch.randn(5, 7, dtype=torch.float64), dim=1).float()
    with pytest.raises(ValueError, match="image_features is a torch.sparse_coo tensor"):
        contrastive_loss(x.to_sparse(), x, 10.0)
    with pytest.raises(ValueError, match="features too large for finite logits"):
        contrastive_loss(x * 1e19, x * 1e19, 10.0)
    big = contrastive_loss(x * 1e3, x * 1e3, 1.0)  # large but within range: computed, finite
    assert torch.isfinite(big)
