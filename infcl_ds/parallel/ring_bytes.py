"""What the CLIP loss Function (clip_function.py) allocates and its ring sends, in bytes, for
the planner: kept beside the code that allocates, so that a change to one is seen in the other.
The sigmoid loss's Function (siglip_function.py) holds no statistics, so no more than these; the
planner counts both losses with them. The G tile they share is counted by ops/g_tiles.py."""
FP32 = 4


def ring_loss_bytes_per_sample(dim: int, elem: int) -> int:
    """Bytes per local sample the ring holds beyond its inputs and outputs in its backward (the
    larger pass), features of width `dim` in `elem`-byte floats: two visiting text blocks
    (features' dtype) with their fp32 column statistics; three fp32 partial text gradients (one
    in flight, one filling, one receiving) and the fp32 image-gradient accumulator; and the
    row and column statistics the forward saved (fp32)."""
    visiting = 2 * dim * elem + 2 * FP32
    partials = 3 * dim * FP32 + dim * FP32
    saved_statistics = 2 * FP32
    return visiting + partials + saved_statistics


def single_device_loss_bytes_per_sample(dim: int) -> int:
    """The same on one device (the ring of one: nothing travels): the fp32 image-gradient
    accumulator and the row and column statistics the forward saved (fp32)."""
    return dim * FP32 + 2 * FP32


def hop_bytes(block: int, dim: int, elem: int) -> tuple:
    """(forward, backward) bytes one rank sends per hop for a block of `block` samples: the text
    block and its fp32 column statistics; in the backward also the fp32 partial text gradient."""
    forward = block * dim * elem + FP32 * block
    return forward, forward + FP32 * block * dim
