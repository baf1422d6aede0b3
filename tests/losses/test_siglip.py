"""sigmoid_loss and the SigLipLoss drop-in against a float64 reference over the B x B logits:
the loss, both feature gradients, and the scale and bias gradients, through the Triton
kernel (interpreter) and the CPU PyTorch path; the ring on gloo ranks (W = 1-4) against one
process; the drop-in against open_clip's SigLipLoss after DDP-style averaging. Under
--gpu the same on CUDA (tests/devices.py): every tensor a loss sees, the scale and bias
included, is made on the test device, as the loss refuses a scale or bias on another
device than the features.

Tolerances (norm-wise relative): fp32 loss 1e-6, feature gradients 1e-5, scale 1e-4 (its
gradient sums G * logits with both signs, so fp32 dot-product rounding loses a digit or
two), bias 1e-5. bf16: loss 1e-5 and scale/bias 1e-3 (fp32 sums of exact-input tiles),
feature gradients 1e-2 (G and the gradients are stored in bf16: ~2^-9 per element).
"""
import pytest
import torch

from reference import rel_err, siglip_loss_reference
from devices import DEVICE, EXACT
from dist_utils import on_ring, run_ranks
from features import random_features

pytestmark = pytest.mark.gpu

TOL = {torch.float32: (1e-6, 1e-5, 1e-4, 1e-5), torch.bfloat16: (1e-5, 1e-2, 1e-3, 1e-3)}

SHAPES = [(1, 8), (2, 80), (37, 96), (130, 640), (257, 80)]  # B=1; B, D off the tile sizes


def scalar(value, **kw):
    """A logit scale or bias on the test device, beside the features."""
    return torch.tensor(value, device=DEVICE, **kw)


def check(image, text, s, b, tol=None, **kw):
    from infcl_ds import sigmoid_loss
    image, text = image.clone().requires_grad_(), text.clone().requires_grad_()
    scale, bias = scalar(s, requires_grad=True), scalar(b, requires_grad=True)
    loss = sigmoid_loss(image, text, scale, bias, **{**EXACT, **kw})
    loss.backward()
    ref_loss, ref_i, ref_t, ref_s, ref_b = siglip_loss_reference(image, text, scale, bias)
    tol_loss, tol_feat, tol_scale, tol_bias = tol or TOL[image.dtype]
    assert image.grad.dtype == image.dtype and text.grad.dtype == text.dtype
    assert scale.grad.shape == scale.shape and bias.grad.shape == bias.shape
    assert abs(loss.item() - ref_loss.item()) <= tol_loss * abs(ref_loss.item())
    assert rel_err(image.grad, ref_i) <= tol_feat
    assert rel_err(text.grad, ref_t) <= tol_feat
    assert rel_err(scale.grad, ref_s) <= tol_scale
    assert rel_err(bias.grad, ref_b) <= tol_bias


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s,b", [(10.0, -10.0), (1 / 0.07, 0.0)])
@pytest.mark.parametrize("B,D", SHAPES)
def test_matches_float64_reference(B, D, s, b, dtype, backend):
    seed = B * 7919 + D
    check(random_features(B, D, dtype, seed), random_features(B, D, dtype, seed + 1), s, b, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_g_tiles_in_panels_and_row_slices(backend, dtype):
    # 64-column panels and 48-row slices over B=257: the diagonal crosses tiles at offsets
    # that are multiples of neither; the bf16 text gradient summed in fp32 across slices.
    image, text = random_features(257, 96, dtype, 5), random_features(257, 96, dtype, 6)
    check(image, text, 10.0, -10.0, backend=backend, _g_tile=(64, 48))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_trained_regime_and_extreme_logits(backend):
    # Correlated pairs at s = 30, b = -12: negatives deep in the tail (e ~ 1e-6, where a
    # plain log(1 + e) loses the loss), positives near zero loss; then unnormalised features
    # whose logits reach +-300 (no overflow, no NaN).
    image = random_features(130, 96, torch.float32, 5)
    text = torch.nn.functional.normalize(image + 0.3 * random_features(130, 96, torch.float32, 6), dim=1)
    check(image, text, 30.0, -12.0, backend=backend)
    big = random_features(70, 80, torch.float32, 7, normalise=False)
    check(big, random_features(70, 80, torch.float32, 8, normalise=False), 30.0, 3.0, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_without_grad_and_with_an_upstream_gradient(backend):
    from infcl_ds import sigmoid_loss
    image, text = random_features(70, 80, torch.float32, 9), random_features(70, 80, torch.float32, 10)
    ref_loss, ref_i, _, ref_s, ref_b = siglip_loss_reference(image, text, torch.tensor(10.0), torch.tensor(-5.0))
    with torch.no_grad():
        loss = sigmoid_loss(image, text, 10.0, -5.0, backend=backend, **EXACT)
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * ref_loss.item()
    # Only the image needs a gradient, and the loss is scaled downstream.
    image.requires_grad_()
    scale = scalar([10.0])  # a 1-element scale keeps its shape
    bias = scalar(-5.0, requires_grad=True)
    (3 * sigmoid_loss(image, text, scale, bias, backend=backend, **EXACT)).backward()
    assert rel_err(image.grad, 3 * ref_i) <= 1e-5 and rel_err(bias.grad, 3 * ref_b) <= 1e-5
    assert scale.grad is None


@pytest.mark.parametrize("make,expected", [
    (lambda i, t: (i, t[:-1], 10.0, 0.0), "batch mismatch"),
    (lambda i, t: (i, t, 10.0, torch.tensor([1.0, 2.0])), "logit_bias must be a 0-dim or 1-element tensor"),
    (lambda i, t: (i, t, 10.0, "bias"), "logit_bias must be a number or a tensor"),
    (lambda i, t: (i, t, 10.0, float("nan")), "logit_bias contains NaN"),
    (lambda i, t: (i.int(), t, 10.0, 0.0), "image_features has dtype"),
    (lambda i, t: (i, t, torch.tensor(float("inf")), 0.0), "logit_scale contains NaN or Inf"),
])
def test_bad_input_names_the_problem(make, expected):
    from infcl_ds import sigmoid_loss
    with pytest.raises(ValueError, match=expected):
        sigmoid_loss(*make(torch.randn(6, 8), torch.randn(6, 8)))


# ---- a second backward and higher-order gradients, as for the CLIP loss ------------------

def _grads_twice(sigmoid_loss, group=None, seed=11, **kw):
    """(first gradients, second with retain_graph, create_graph's error) of one loss; the
    features are seed's and seed+1's 37 x 80 rows, the whole batch or this rank's slice."""
    image, text = (random_features(37, 80, torch.float32, seed + k).requires_grad_() for k in (0, 1))
    scale, bias = scalar(10.0, requires_grad=True), scalar(-5.0, requires_grad=True)
    inputs = (image, text, scale, bias)
    loss = sigmoid_loss(image, text, scale, bias, group, **kw)
    first = [g.clone() for g in torch.autograd.grad(loss, inputs, retain_graph=True)]
    second = torch.autograd.grad(loss, inputs, retain_graph=True)
    try:
        torch.autograd.grad(sigmoid_loss(image, text, scale, bias, group, **kw), inputs, create_graph=True)
        refused = None
    except RuntimeError as err:
        refused = str(err)
    return first, list(second), refused


REFUSED = ("infcl_ds: double backward (create_graph=True, higher-order gradients) of the sigmoid (SigLIP) loss "
           "is not supported")


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_second_backward_gives_the_same_gradients_and_double_backward_is_refused(backend):
    from infcl_ds import sigmoid_loss
    first, second, refused = _grads_twice(sigmoid_loss, backend=backend)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # The gradient of a gradient is refused, never silently a constant.
    assert refused == REFUSED
    # .backward() twice accumulates twice; without retain_graph the graph is freed (torch's error).
    image, text = random_features(9, 16, torch.float32, 1).requires_grad_(), random_features(9, 16, torch.float32, 2)
    loss = sigmoid_loss(image, text, 10.0, -5.0, backend=backend)
    loss.backward(retain_graph=True)
    once = image.grad.clone()
    loss.backward()
    assert torch.allclose(image.grad, 2 * once)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def _ring_twice(rank, world):
    from infcl_ds import sigmoid_loss
    return _grads_twice(lambda i, t, s, b, group: sigmoid_loss(i, t, s, b, group, backend="torch"),
                        seed=11 + 2 * rank)


def test_the_ring_too_gives_the_same_gradients_twice_and_refuses_double_backward():
    results = run_ranks(_ring_twice, 2)
    for rank in range(2):
        first, second, refused = results[rank]
        for a, b in zip(first, second):
            assert torch.equal(a, b), rank
        assert refused == REFUSED, rank


# ---- the ring on gloo ranks -------------------------------------------------------------

RING_TOL = {torch.float32: (1e-6, 1e-5, 1e-4, 1e-5), torch.bfloat16: (1e-5, 1e-2, 1e-3, 1e-3)}


def _ring_cases(rank, world, cases, group_ranks=None):
    return on_ring(rank, group_ranks, _ring_case, cases)


def _ring_case(case, group, pos):
    from infcl_ds import sigmoid_loss
    sizes, D, dtype, s, b, backend, seed, tiles = case
    total = sum(sizes)
    lo = sum(sizes[:pos])
    image = random_features(total, D, dtype, seed)[lo:lo + sizes[pos]].clone().requires_grad_()
    text = random_features(total, D, dtype, seed + 1)[lo:lo + sizes[pos]].clone().requires_grad_()
    scale, bias = scalar(s, requires_grad=True), scalar(b, requires_grad=True)
    loss = sigmoid_loss(image, text, scale, bias, group=group, backend=backend, **EXACT, **(tiles or {}))
    loss.backward()
    return loss.item(), image.grad, text.grad, scale.grad, bias.grad


def _check_ring(results, cases, order):
    for k, (sizes, D, dtype, s, b, backend, seed, _tiles) in enumerate(cases):
        total = sum(sizes)
        ref = siglip_loss_reference(random_features(total, D, dtype, seed), random_features(total, D, dtype, seed + 1),
                                    torch.tensor(s), torch.tensor(b))
        tol_loss, tol_feat, tol_scale, tol_bias = RING_TOL[dtype]
        for pos, rank in enumerate(order):
            loss, gi, gt, gs, gb = results[rank][k]
            lo, hi = sum(sizes[:pos]), sum(sizes[:pos + 1])
            where = f"case {k} {sizes} D={D} {dtype} {backend} rank {rank}"
            assert abs(loss - ref[0].item()) <= tol_loss * abs(ref[0].item()), where
            assert gi.dtype == dtype and gi.shape == (sizes[pos], D), where
            assert rel_err(gi, ref[1][lo:hi]) <= tol_feat, where
            assert rel_err(gt, ref[2][lo:hi]) <= tol_feat, where
            assert rel_err(gs, ref[3]) <= tol_scale, where
            assert rel_err(gb, ref[4]) <= tol_bias, where


def ring_cases(world):
    even, uneven = [37] * world, [13 + 29 * r for r in range(world)]
    return [
        (even, 80, torch.float32, 10.0, -10.0, "triton", 1, None),
        (uneven, 96, torch.bfloat16, 1 / 0.07, -3.0, "triton", 2, {"_g_tile": (64, 32)}),
        (uneven, 80, torch.float32, 10.0, -10.0, "torch", 3, {"_g_tile": (32, 24)}),
        (even, 96, torch.bfloat16, 10.0, -10.0, "torch", 4, None),
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_matches_single_process_reference(world):
    cases = ring_cases(world)
    _check_ring(run_ranks(_ring_cases, world, cases), cases, list(range(world)))


def test_ring_on_a_subgroup_follows_group_order():
    cases = [([20, 45, 31], 80, torch.float32, 10.0, -10.0, "torch", 5, None)]
    results = run_ranks(_ring_cases, 4, cases, [1, 2, 3])
    assert results[0] == []
    _check_ring(results, cases, [1, 2, 3])


def _mismatch(rank, world, kind):
    from infcl_ds import sigmoid_loss
    image, text = torch.randn(8, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    bias = -10.0
    if kind == "bias" and rank == 1:
        bias = -9.0
    if kind == "nan" and rank == 2:
        bias = float("nan")
    try:
        sigmoid_loss(image, text, 10.0, bias)
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("kind,expected", [("bias", "sigmoid_loss: logit_bias differs across ranks"),
                                           ("nan", "rank 2: logit_bias contains NaN")])
def test_bad_input_on_one_rank_raises_on_every_rank(kind, expected):
    results = run_ranks(_mismatch, 3, kind)
    for rank in range(3):
        assert expected in results[rank], (rank, results[rank])


# ---- the open_clip drop-in ----------------------------------------------------------------

def _drop_in_steps(rank, world):
    """Parameter gradients after DDP-style averaging and losses, for open_clip's SigLipLoss
    with each dist_impl and for infcl_ds.SigLipLoss."""
    import torch.distributed as torch_dist
    import torch.nn.functional as F

    out = {}
    for impl in ("bidir", "shift", "reduce", "gather"):
        for which in ("open_clip", "infcl_ds"):
            if which == "open_clip":
                from open_clip.loss import SigLipLoss
            else:
                from infcl_ds import SigLipLoss
            loss_fn = SigLipLoss(rank=rank, world_size=world, dist_impl=impl)
            torch.manual_seed(0)
            image_enc, text_enc = torch.nn.Linear(12, 16).to(DEVICE), torch.nn.Linear(10, 16).to(DEVICE)
            logit_scale, logit_bias = torch.nn.Parameter(scalar(2.3)), torch.nn.Parameter(scalar(-4.0))
            g = torch.Generator().manual_seed(100 + rank)
            images, texts = (torch.randn(9, n, generator=g).to(DEVICE) for n in (12, 10))
            loss = loss_fn(F.normalize(image_enc(images), dim=-1), F.normalize(text_enc(texts), dim=-1),
                           logit_scale.exp(), logit_bias)
            loss.backward()
            grads = []
            for p in [*image_enc.parameters(), *text_enc.parameters(), logit_scale, logit_bias]:
                torch_dist.all_reduce(p.grad)  # what DDP does: average across ranks
                grads.append(p.grad / world)
            losses = [torch.zeros((), device=DEVICE) for _ in range(world)]
            torch_dist.all_gather(losses, loss.detach())
            out[impl, which] = {"loss": loss.item(), "all_losses": [x.item() for x in losses], "grads": grads}
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_drop_in_for_open_clip_every_dist_impl(world):
    results = run_ranks(_drop_in_steps, world)
    for rank in range(world):
        for impl in ("bidir", "shift", "reduce", "gather"):
            ours, theirs = results[rank][impl, "infcl_ds"], results[rank][impl, "open_clip"]
            mean_theirs = sum(theirs["all_losses"]) / world
            assert abs(ours["loss"] - mean_theirs) <= 1e-5 * abs(mean_theirs), (impl, rank)
            for a, b in zip(ours["grads"], theirs["grads"]):
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (impl, rank, a, b)


def test_drop_in_rejects_a_wrong_world_size_and_dist_impl():
    from infcl_ds import SigLipLoss
    with pytest.raises(ValueError, match="dist_impl"):
        SigLipLoss(dist_impl="allgather")
    with pytest.raises(ValueError, match="world_size=2"):
        SigLipLoss(world_size=2)(torch.randn(3, 4), torch.randn(3, 4), torch.tensor(1.0), torch.tensor(0.0))
    out = SigLipLoss()(torch.randn(3, 4), torch.randn(3, 4), torch.tensor(1.0), torch.tensor(0.0), output_dict=True)
    assert set(out) == {"contrastive_loss"}


def test_unknown_arguments_are_refused_at_construction():
    from infcl_ds import SigLipLoss, SigmoidLoss
    # The drop-in answers as open_clip's own constructor would: a TypeError.
    with pytest.raises(TypeError, match=r"^infcl_ds.SigLipLoss: unknown argument\(s\) foo; loss options are "
                                        r"check_finite, allow_tf32, backend$"):
        SigLipLoss(foo=1)
    # The module around sigmoid_loss, as ContrastiveLoss around contrastive_loss: a ValueError.
    with pytest.raises(ValueError, match=r"^infcl_ds.SigmoidLoss: unknown argument\(s\) chek_finite; "):
        SigmoidLoss(chek_finite=False)
    SigLipLoss(check_finite=False, backend="torch")  # the real options pass
    SigmoidLoss(check_finite=False, backend="torch")
