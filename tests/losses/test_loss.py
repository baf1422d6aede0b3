"""contrastive_loss against the float64 reference: loss, both feature gradients and the
logit-scale gradient, through the Triton kernels (interpreter) and the CPU PyTorch path.

Tolerances (norm-wise relative): fp32 1e-5 everywhere. bf16/fp16: loss 1e-4 and logit-scale
gradient 1e-3 (fp32 statistics and sums), feature gradients 1e-2 (the gradients themselves
and the G panel are stored in the input dtype: ~2^-9 per element).
"""
import math

import pytest
import torch

from infcl_ds import ContrastiveLoss, contrastive_loss
from reference import clip_loss_reference, rel_err
from devices import EXACT
from features import random_features

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-5, 1e-5, 1e-5), torch.bfloat16: (1e-4, 1e-2, 1e-3), torch.float16: (1e-4, 1e-2, 1e-3)}

SHAPES = [  # (B, D): B=1, tiny, not multiples of the tile, D not powers of two
    (1, 8), (2, 80), (37, 96), (130, 640), (257, 1280), (257, 80), (70, 8),
]


def check(image, text, scale, tol=None, **kw):
    image = image.clone().requires_grad_()
    text = text.clone().requires_grad_()
    scale = scale.clone().requires_grad_()
    loss = contrastive_loss(image, text, scale, **{**EXACT, **kw})
    loss.backward()
    ref_loss, ref_i, ref_t, ref_s = clip_loss_reference(image, text, scale)
    tol_loss, tol_feat, tol_scale = tol or TOL[image.dtype]
    assert torch.isfinite(loss)
    # The loss is a difference of O(s) numbers (log-sum-exp minus the positive logit), so
    # its absolute error carries s times the fp32 rounding of a dot product.
    assert abs(loss.item() - ref_loss.item()) <= tol_loss * max(1.0, abs(ref_loss.item())) + 1e-6 * float(scale.detach())
    assert image.grad.dtype == image.dtype and text.grad.dtype == text.dtype
    assert image.grad.shape == image.shape and scale.grad.shape == scale.shape
    if image.shape[0] == 1:  # a batch of one has zero gradients: P = Q = 1 up to rounding
        bound = 1e-5 * float(scale.detach())
        assert image.grad.abs().max() <= bound and text.grad.abs().max() <= bound
        assert abs(scale.grad.item()) <= 1e-5
        return
    assert rel_err(image.grad, ref_i) <= tol_feat
    assert rel_err(text.grad, ref_t) <= tol_feat
    assert rel_err(scale.grad, ref_s) <= tol_scale


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s", [1 / 0.07, 100.0])
@pytest.mark.parametrize("B,D", SHAPES)
def test_matches_float64_reference(B, D, s, dtype, backend):
    seed = B * 7919 + D
    image = random_features(B, D, dtype, seed)
    text = random_features(B, D, dtype, seed + 1)
    check(image, text, torch.tensor(s), backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_several_backward_panels(backend):
    # 64-column G tiles with B=257: five panels, the last one partial, the diagonal crossing them all.
    image, text = random_features(257, 96, torch.float32, 1), random_features(257, 96, torch.float32, 2)
    check(image, text, torch.tensor(30.0), backend=backend, _g_tile=(64, None))


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_in_row_slices(backend, dtype):
    # G walked in 64-column panels and 48-row slices over B=257: 5 x 6 tiles, the diagonal
    # entering tiles at offsets that are not multiples of either; the text gradient of the
    # slices summed in fp32 before its one rounding to bf16.
    image, text = random_features(257, 96, dtype, 5), random_features(257, 96, dtype, 6)
    check(image, text, torch.tensor(30.0), backend=backend, _g_tile=(64, 48))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_fp16_and_1_element_scale(backend):
    image, text = random_features(130, 80, torch.float16, 3), random_features(130, 80, torch.float16, 4)
    check(image, text, torch.tensor([1 / 0.07]), backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("noise,s", [(1.5, 30.0), (2.0, 100.0)])
def test_trained_regime_with_correlated_pairs(noise, s, dtype, backend):
    # Positives far above the negatives (loss 0.02-0.2, a trained model's regime): there
    # P_ii + Q_ii - 2 is a small difference, kept exact by folding it in fp32 before
    # rounding G. fp32 tolerances are looser here because the fp32 log-sum-exp itself
    # loses digits to that cancellation (any fp32 implementation does).
    image = random_features(130, 96, torch.float32, 5, normalise=False)
    text = image + noise * random_features(130, 96, torch.float32, 6, normalise=False)
    image = torch.nn.functional.normalize(image, dim=1).to(dtype)
    text = torch.nn.functional.normalize(text, dim=1).to(dtype)
    check(image, text, torch.tensor(s), tol={torch.float32: (1e-5, 1e-4, 1e-3),
                                              torch.bfloat16: (1e-4, 1e-2, 1e-3)}[dtype], backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_unnormalised_features(backend):
    image = random_features(130, 96, torch.float32, 5, normalise=False) * 0.3
    text = random_features(130, 96, torch.float32, 6, normalise=False) * 0.3
    check(image, text, torch.tensor(5.0), backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_no_overflow_when_all_logits_are_at_the_maximum(backend):
    # Identical features: every logit is s = 100, where a fixed-shift scheme over/underflows.
    # The exact gradient is zero by symmetry: rounding may leave ~1e-6, never a NaN.
    image = torch.nn.functional.normalize(torch.ones(37, 80), dim=1).requires_grad_()
    text = image.detach().clone().requires_grad_()
    loss = contrastive_loss(image, text, torch.tensor(100.0), backend=backend, **EXACT)
    loss.backward()
    assert abs(loss.item() - math.log(37)) < 1e-4
    assert image.grad.abs().max() < 1e-4 and text.grad.abs().max() < 1e-4


def test_module_and_plain_float_scale():
    image, text = random_features(37, 80, torch.float32, 7), random_features(37, 80, torch.float32, 8)
    expected = clip_loss_reference(image, text, torch.tensor(20.0))[0]
    assert abs(ContrastiveLoss(**EXACT)(image, text, torch.tensor(20.0)).item() - expected.item()) < 1e-5
    assert abs(contrastive_loss(image, text, 20.0, **EXACT).item() - expected.item()) < 1e-5


def test_exact_fp32_option_and_scale_without_grad():
    image, text = random_features(37, 80, torch.float32, 9), random_features(37, 80, torch.float32, 10)
    image.requires_grad_()
    loss = contrastive_loss(image, text, torch.tensor(10.0), allow_tf32=False)
    loss.backward()
    _, ref_i, _, _ = clip_loss_reference(image, text, torch.tensor(10.0))
    assert rel_err(image.grad, ref_i) <= 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_rows_of_very_different_scale(backend):
    # Row norms from 0.05 to 3 at s = 100: logits of one tile span hundreds of units, so
    # the kernels' one-exponential fast path must hand over to per-row/column shifts.
    g = torch.Generator().manual_seed(13)
    norms = torch.logspace(-1.3, 0.5, 130)[torch.randperm(130, generator=g, device="cpu")]
    image = random_features(130, 80, torch.float32, 14) * norms[:, None]
    text = random_features(130, 80, torch.float32, 15) * norms.flip(0)[:, None]
    check(image, text, torch.tensor(100.0), tol=(1e-5, 1e-4, 1e-4), backend=backend)


def test_tf32_follows_pytorchs_float32_matmul_precision_unless_given():
    from infcl_ds.losses._prologue import kernel_options
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # PyTorch's default: IEEE fp32 products
        assert not kernel_options("auto", None, None).allow_tf32
        torch.set_float32_matmul_precision("high")
        assert kernel_options("auto", None, None).allow_tf32
        assert not kernel_options("auto", False, None).allow_tf32
    finally:
        torch.set_float32_matmul_precision(old)
