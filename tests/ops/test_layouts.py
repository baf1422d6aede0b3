"""Every feature layout, on every path: contrastive_loss and sigmoid_loss of views that are
transposed, row-strided, column-strided, offset into a bigger storage, expanded (along the
batch or along the width) or overlapping (torch.as_strided, row stride < D), against the
float64 reference (tests/reference.py's full-logits losses) of the same view of the same
values. The loss is taken on a view of a leaf, so every gradient is checked where it lands:
the leaf's .grad, through the view's own backward (summed over expanded or overlapping
elements), beside the logit-scale gradient and SigLIP's bias gradient. One device with the
Triton kernels (the interpreter on the CPU) and the PyTorch path, a ring of two ranks (gloo
on the CPU, NCCL one GPU each under --gpu) in one spawned run, the launchers themselves, and
the crop-and-resize kernel's images.

Each case puts the image features in one layout and the text features in the next one of
LAYOUTS, so that every layout is read on both sides of a block (its rows and its columns)
and, over the ring, in the text blocks that travel. Sizes are off the tiles: B = 19, 37 and
uneven ring batches; D = 7, 24.

Tolerances (norm-wise relative; the loss relative to max(1, |loss|)): fp32 1e-5, on the CPU
interpreter and on CUDA alike (EXACT: IEEE fp32 products), except SigLIP's scale gradient,
1e-4 (a sum of terms of both signs, as in test_siglip.py). bf16 (one case per loss):
loss 1e-4, feature gradients 1e-2 (G and the gradients are stored in bf16), scale and bias
1e-3.
"""
import math

import pytest
import torch

from reference import full_logits_loss, full_logits_sigmoid_loss, rel_err
from devices import DEVICE, EXACT
from dist_utils import run_ranks

pytestmark = pytest.mark.gpu

# name: (the leaf's shape, the [B, D] view of it the loss sees)
LAYOUTS = {
    "contiguous": (lambda B, D: (B, D), lambda t, B, D: t),
    "transposed": (lambda B, D: (D, B), lambda t, B, D: t.T),  # stored [D, B]: strides (1, B)
    "row-strided": (lambda B, D: (2 * B, D), lambda t, B, D: t[::2]),
    "column-strided": (lambda B, D: (B, 2 * D), lambda t, B, D: t[:, ::2]),
    "offset": (lambda B, D: (B + 1, D + 3), lambda t, B, D: t[1:, 3:]),
    "expanded-B": (lambda B, D: (1, D), lambda t, B, D: t.expand(B, D)),  # row stride 0
    "expanded-D": (lambda B, D: (B, 1), lambda t, B, D: t.expand(B, D)),  # last stride 0
    "overlapping": (lambda B, D: ((B - 1) * max(1, D // 3) + D,),
                    lambda t, B, D: t.as_strided((B, D), (max(1, D // 3), 1))),
}
NAMES = list(LAYOUTS)
# Image in one layout, text in the next: each layout on both sides of a block.
PAIRS = [(NAMES[k], NAMES[(k + 1) % len(NAMES)]) for k in range(len(NAMES))]

SCALE, BIAS = 10.0, -5.0
TOL = {  # (loss, features, scale, bias)
    ("clip", torch.float32): (1e-5, 1e-5, 1e-5, None),
    ("siglip", torch.float32): (1e-5, 1e-5, 1e-4, 1e-5),
    ("clip", torch.bfloat16): (1e-4, 1e-2, 1e-3, None),
    ("siglip", torch.bfloat16): (1e-4, 1e-2, 1e-3, 1e-3),
}


def make_leaf(layout, B, D, dtype, seed, device=DEVICE):
    """The storage of a layout: modest values (randn / sqrt(D)) drawn on the CPU, then moved."""
    g = torch.Generator().manual_seed(seed)
    shape = LAYOUTS[layout][0](B, D)
    return (torch.randn(shape, generator=g) / math.sqrt(D)).to(device, dtype)


def view_of(layout, leaf, B, D):
    return LAYOUTS[layout][1](leaf, B, D)


def our_loss(kind, image, text, scale, bias, **kw):
    from infcl_ds import contrastive_loss, sigmoid_loss
    if kind == "clip":
        return contrastive_loss(image, text, scale, **EXACT, **kw)
    return sigmoid_loss(image, text, scale, bias, **EXACT, **kw)


def run_case(kind, layouts, sizes, D, dtype, seed, pos=0, **kw):
    """Our loss on rank ``pos``'s views (the whole batch on one device): (loss, image leaf's
    grad, text leaf's grad, scale grad, bias grad or None)."""
    B = sizes[pos]
    leaves = [make_leaf(layout, B, D, dtype, seed + 100 * pos + side).requires_grad_()
              for side, layout in enumerate(layouts)]
    scale = torch.tensor(SCALE, device=DEVICE, requires_grad=True)
    bias = torch.tensor(BIAS, device=DEVICE, requires_grad=True)
    image, text = (view_of(layout, leaf, B, D) for layout, leaf in zip(layouts, leaves))
    loss = our_loss(kind, image, text, scale, bias, **kw)
    loss.backward()
    return loss.item(), leaves[0].grad, leaves[1].grad, scale.grad, bias.grad if kind == "siglip" else None


def reference(kind, layouts, sizes, D, dtype, seed):
    """The float64 loss of the concatenated views of every rank's leaves (the same rounded
    values), with d loss / d each rank's leaves and d scale (and d bias)."""
    leaves = [[make_leaf(layout, B, D, dtype, seed + 100 * pos + side, "cpu").double().requires_grad_()
               for side, layout in enumerate(layouts)] for pos, B in enumerate(sizes)]
    image, text = (torch.cat([view_of(layouts[side], ls[side], B, D) for ls, B in zip(leaves, sizes)])
                   for side in (0, 1))
    scale = torch.tensor(SCALE, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(BIAS, dtype=torch.float64, requires_grad=True)
    if kind == "clip":
        loss = full_logits_loss(image, text, scale)
    else:
        loss = full_logits_sigmoid_loss(image, text, scale, bias)
    loss.backward()
    return (loss.item(), [(ls[0].grad, ls[1].grad) for ls in leaves], scale.grad,
            bias.grad if kind == "siglip" else None)


def check(got, ref, pos, kind, dtype, where):
    loss, grad_image, grad_text, grad_scale, grad_bias = got
    ref_loss, ref_leaves, ref_scale, ref_bias = ref
    tol_loss, tol_feat, tol_scale, tol_bias = TOL[kind, dtype]
    assert abs(loss - ref_loss) <= tol_loss * max(1.0, abs(ref_loss)), (where, loss, ref_loss)
    assert grad_image.dtype == dtype and grad_text.dtype == dtype, where
    pairs = [("image", grad_image, ref_leaves[pos][0], tol_feat), ("text", grad_text, ref_leaves[pos][1], tol_feat),
             ("scale", grad_scale, ref_scale, tol_scale)]
    if kind == "siglip":
        pairs.append(("bias", grad_bias, ref_bias, tol_bias))
    for name, grad, ref_grad, tol in pairs:
        assert rel_err(grad, ref_grad) <= tol, (where, name, rel_err(grad, ref_grad))


# ---- one device ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kind", ["clip", "siglip"])
@pytest.mark.parametrize("layouts", PAIRS, ids=[f"{i}+{t}" for i, t in PAIRS])
def test_one_device_matches_float64_reference(layouts, kind, backend):
    k = PAIRS.index(layouts)
    B, D = [(19, 24), (37, 7)][k % 2]
    got = run_case(kind, layouts, [B], D, torch.float32, seed=k, backend=backend)
    check(got, reference(kind, layouts, [B], D, torch.float32, seed=k), 0, kind, torch.float32,
          f"{layouts} {kind} {backend} B={B} D={D}")


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_bf16_transposed_and_column_strided(kind):
    layouts = ("transposed", "column-strided")
    got = run_case(kind, layouts, [37], 24, torch.bfloat16, seed=50, backend="triton")
    check(got, reference(kind, layouts, [37], 24, torch.bfloat16, seed=50), 0, kind, torch.bfloat16,
          f"{layouts} {kind} bf16")


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_sigmoid_loss_of_a_batch_of_one(backend):
    # B = 1 is meaningful for SigLIP only (CLIP's gradients vanish there): a column-strided
    # image against a text expanded along D.
    layouts = ("column-strided", "expanded-D")
    got = run_case("siglip", layouts, [1], 7, torch.float32, seed=60, backend=backend)
    check(got, reference("siglip", layouts, [1], 7, torch.float32, seed=60), 0, "siglip", torch.float32,
          f"{layouts} B=1 {backend}")


# ---- the ring -------------------------------------------------------------------------------

RING_SIZES, RING_D = [19, 12], 24
RING_CASES = [(kind, layouts, backend, k) for k, layouts in enumerate(PAIRS)
              for kind in ("clip", "siglip") for backend in ("triton", "torch")]


def _ring_cases(rank, world, cases):
    return [run_case(kind, layouts, RING_SIZES, RING_D, torch.float32, seed, pos=rank, backend=backend)
            for kind, layouts, backend, seed in cases]


def test_ring_of_two_matches_float64_reference():
    """Every layout pair, both losses, both backends in one spawned run (a spawn costs seconds)."""
    results = run_ranks(_ring_cases, 2, RING_CASES)
    for k, (kind, layouts, backend, seed) in enumerate(RING_CASES):
        ref = reference(kind, layouts, RING_SIZES, RING_D, torch.float32, seed)
        for rank in range(2):
            check(results[rank][k], ref, rank, kind, torch.float32, f"ring {layouts} {kind} {backend} rank {rank}")


# ---- the launchers, called directly -----------------------------------------------------------

def _launcher_views(B, D):
    """(layout name, a [B, D] fp32 view) for the layouts that are not row-major (copied)."""
    return [(name, view_of(name, make_leaf(name, B, D, torch.float32, seed=70 + k), B, D))
            for k, name in enumerate(("transposed", "column-strided", "expanded-D", "expanded-B", "overlapping"))]


def test_triton_launchers_read_any_layout_as_its_contiguous_copy():
    from infcl_ds.ops import grad_panel, lse, siglip_sweep
    B, D = 19, 24
    scale = torch.tensor([SCALE], device=DEVICE)
    bias = torch.tensor([BIAS], device=DEVICE)
    other = make_leaf("contiguous", B, D, torch.float32, seed=80)
    for name, x in _launcher_views(B, D):
        dense = x.contiguous()
        for a, b, a_dense, b_dense in ((x, other, dense, other), (other, x, other, dense)):
            rows, cols = lse.similarity_lse(a, b, scale, "ieee")
            want_rows, want_cols = lse.similarity_lse(a_dense, b_dense, scale, "ieee")
            assert torch.equal(rows, want_rows) and torch.equal(cols, want_cols), name
            g, want_g = (torch.empty(B, B, device=DEVICE) for _ in range(2))
            ds = grad_panel.grad_panel(a, b, scale, rows, cols, g, 0, "ieee")
            want_ds = grad_panel.grad_panel(a_dense, b_dense, scale, rows, cols, want_g, 0, "ieee")
            assert torch.equal(g, want_g) and torch.equal(ds, want_ds), name
            sums = siglip_sweep.triton_tile(a, b, scale, bias, g, 0, "ieee")
            want_sums = siglip_sweep.triton_tile(a_dense, b_dense, scale, bias, want_g, 0, "ieee")
            assert torch.equal(g, want_g) and torch.equal(sums, want_sums), name


def test_only_layouts_the_kernels_and_gemms_cannot_read_are_copied():
    from infcl_ds.ops.layout import as_row_major
    B, D = 5, 6
    for name in ("contiguous", "row-strided", "offset"):
        x = view_of(name, make_leaf(name, B, D, torch.float32, seed=1), B, D)
        assert as_row_major(x) is x, name
    for name in ("transposed", "column-strided", "expanded-D", "expanded-B", "overlapping"):
        x = view_of(name, make_leaf(name, B, D, torch.float32, seed=1), B, D)
        y = as_row_major(x)
        assert y.is_contiguous() and torch.equal(y, x), name
    column = torch.randn(2, B, device=DEVICE).T[:, :1]  # one column: its stride is never followed
    assert as_row_major(column) is column


@pytest.mark.parametrize("layout", ["contiguous", "row-strided"])
def test_row_major_features_are_saved_without_a_copy(layout):
    """The normal path costs nothing: on one device the CLIP Function keeps the caller's own
    features for its backward (over a ring, a row-strided text block is made contiguous to
    travel)."""
    leaves = [make_leaf(layout, 19, 24, torch.float32, seed=s).requires_grad_() for s in (1, 2)]
    image, text = (view_of(layout, leaf, 19, 24) for leaf in leaves)
    saved = []

    def pack(t):
        saved.append(t.data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        our_loss("clip", image, text, torch.tensor(SCALE, device=DEVICE), None)
    assert image.data_ptr() in saved and text.data_ptr() in saved


# ---- the crop-and-resize kernel's images --------------------------------------------------------

def test_resize_kernel_reads_images_of_any_layout():
    from infcl_ds.data.decoding.device_decode import Box
    from infcl_ds.ops.resize import resized_crops_kernel
    g = torch.Generator().manual_seed(3)
    hwc = torch.randint(0, 256, (13, 17, 3), dtype=torch.uint8, generator=g)
    wide = torch.randint(0, 256, (3, 13, 40), dtype=torch.uint8, generator=g)
    images = [hwc.permute(2, 0, 1), wide[:, 1:, 3::2]]  # channels-last; offset, every other column
    boxes = [Box(1, 2, 10, 12, 8, 8, 0, 0), Box(2, 1, 9, 15, 8, 8, 0, 0)]
    got = resized_crops_kernel([im.to(DEVICE) for im in images], boxes, 8)
    want = resized_crops_kernel([im.contiguous().to(DEVICE) for im in images], boxes, 8)
    assert torch.equal(got, want)
