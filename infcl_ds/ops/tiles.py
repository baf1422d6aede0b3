"""The one tile primitive every kernel shares: a BLOCK_M x BLOCK_N tile of A @ B^T.

Feature widths in contrastive learning are 512-1280, far wider than an attention head, so
a row tile of A cannot stay in SRAM: the tile is a small GEMM with a K loop over D, like
Triton's matmul tutorial. Operands are loaded in their storage dtype (bf16/fp16 go to the
tensor cores as they are) and accumulated in fp32.
"""
import triton
import triton.language as tl


@triton.jit
def similarity_tile(
    A, B, offs_m, offs_n, D, stride_a, stride_b,
    row_ok, col_ok,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Return the fp32 tile ``A[offs_m] @ B[offs_n]^T`` (rows/cols outside the masks are 0).

    A, B: [n, D] pointers with unit-stride rows (last stride 1: the launchers see to it,
      ops/layout.py); stride_a/stride_b: their row strides.
    EVEN_K: D % BLOCK_K == 0, so the K loop needs no column mask.
    UPCAST: load-then-upcast to fp32 (TRITON_INTERPRET: its bf16 dot is wrong).
    INPUT_PRECISION: "tf32" or "ieee" for fp32 operands; ignored for bf16/fp16.
    """
    offs_k = tl.arange(0, BLOCK_K)
    # 64-bit row offsets: a 4M x 768 batch has more than 2^31 elements.
    a_ptrs = A + offs_m.to(tl.int64)[:, None] * stride_a + offs_k[None, :]
    b_ptrs = B + offs_n.to(tl.int64)[:, None] * stride_b + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < D
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc
