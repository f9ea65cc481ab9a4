"""Block-wise int8 / int4 weights for onnxruntime's `MatMulNBits` (and `GatherBlockQuantized`).

Blocks of `block_size` consecutive input rows per output column, one scale per block.
`WEIGHT_ONLY` says each method's default block and whether its blocks are symmetric (int8:
zero point 2^(bits-1), the op's default, so no zero-point tensor) or asymmetric (int4: each
block's min..max spans the 16 levels, with a 4-bit zero point per block). Layout, as the op's
spec and onnxruntime's `matmul_nbits_quantizer` lay it out: B is uint8 [N, k_blocks,
block_size * bits / 8]; for 4 bits element 2j of a block sits in the low nibble of byte j and
element 2j+1 in the high nibble; scales are [N * k_blocks] in the activation dtype; 4-bit zero
points are [N * ceil(k_blocks / 2)], two a byte, low nibble first, each column padded to a
whole byte. `GatherBlockQuantized` reads the same bytes as [N, K * bits / 8] rows, which is how
an embedding table shares them with a tied LM head.

The quantize/dequantize pairs here are exact inverses of what the graph computes, so a test
can fake-quantize a transformers model the same way and compare like with like.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WeightFormat:
    """How a weight-only method stores a matrix for MatMulNBits."""

    bits: int
    block_size: int  # the default weights per scale (`--block-size` overrides it)
    zero_points: bool  # asymmetric blocks (a zero point each) or symmetric ones


# The defaults, measured by `python -m benchmarks.decode` (speed, 2 threads, next to
# llama.cpp's Q8_0 / Q4_0) and `python -m benchmarks.quant` (the logits' KL to fp32 on the
# trained target); docs/tuning.md:
# * int8, symmetric blocks of 128: onnxruntime's 8-bit kernel runs 1.1-1.9x faster than at
#   block 32 on the Qwen2.5-0.5B shape and reads 8.25 bits a weight (Q8_0: 8.5); the KL stays
#   ~1e-4, as Q8_0's. Zero points bring int8 nothing measurable.
# * int4, asymmetric blocks of 128 (GPTQ's and AWQ's usual group): 4.28 bits a weight (Q4_0:
#   4.5), the KL and top-1 agreement of Q4_0, and ~1.27x the speed of block 32.
#   `--block-size 32` rounds closer (a third under Q4_0's KL) at ~3/4 of the speed.
WEIGHT_ONLY = {
    "int8": WeightFormat(bits=8, block_size=128, zero_points=False),
    "int4": WeightFormat(bits=4, block_size=128, zero_points=True),
}
BITS = {method: f.bits for method, f in WEIGHT_ONLY.items()}
BLOCK_SIZES = (16, 32, 64, 128, 256)


def block_for(k: int, block_size: int) -> int:
    """The block a [k, N] matrix is stored with: `block_size`, or where k is not a multiple
    of it the largest supported smaller block that divides k (SmolLM2's k = 576 with block
    128 would pad every column by 11%; a model's tiny k = 64 would double in size); a k no
    supported block divides is padded."""
    fits = [b for b in BLOCK_SIZES if b <= block_size and k % b == 0]
    return block_size if k % block_size == 0 or not fits else max(fits)


def quantize_blocks(
    w: np.ndarray, bits: int, block_size: int, zero_points: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """w [K, N] -> (packed uint8 [N, k_blocks, block_size * bits // 8], fp32 scales
    [N * k_blocks], packed zero points or None), laid out as the module docstring says.

    Symmetric: levels -(2^(bits-1) - 1) .. 2^(bits-1) - 1 around the op's default zero point
    2^(bits-1). Asymmetric: the block's range min(w, 0) .. max(w, 0) spans all 2^bits levels
    (so 0 stays exact), zero point rounded to a level.
    K is zero-padded to whole blocks (the op reads K from its attribute and ignores the pad)."""
    k, n = w.shape
    blocks = -(-k // block_size)
    wt = np.zeros((n, blocks * block_size), np.float32)
    wt[:, :k] = w.T
    wt = wt.reshape(n, blocks, block_size)
    if zero_points:
        levels = 2**bits - 1
        low = np.minimum(wt.min(axis=2), 0.0)
        scale = (np.maximum(wt.max(axis=2), 0.0) - low) / levels
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        zp = np.clip(np.round(-low / scale), 0, levels).astype(np.uint8)
        q = np.clip(np.round(wt / scale[..., None]) + zp[..., None], 0, levels).astype(np.uint8)
    else:
        top = 2 ** (bits - 1) - 1  # 7 or 127: symmetric, so -8 / -128 stay unused
        scale = np.abs(wt).max(axis=2) / top
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        q = (np.clip(np.round(wt / scale[..., None]), -top, top) + top + 1).astype(np.uint8)
        zp = None
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
        if zp is not None:
            zp = np.pad(zp, ((0, 0), (0, blocks % 2)))  # each column to a whole byte
            zp = zp[:, 0::2] | (zp[:, 1::2] << 4)
    zp = None if zp is None else np.ascontiguousarray(zp).reshape(-1)
    return np.ascontiguousarray(q), scale.reshape(-1), zp


def dequantize_blocks(
    packed: np.ndarray,
    scales: np.ndarray,
    k: int,
    bits: int,
    zero_points: np.ndarray | None = None,
) -> np.ndarray:
    """The [K, N] float32 weights MatMulNBits computes with."""
    n, blocks, width = packed.shape
    q = _unpack(packed, bits)
    if zero_points is None:
        zp = np.float32(2 ** (bits - 1))
    else:
        zp = _unpack(zero_points.reshape(n, 1, -1), bits)[:, 0, :blocks, None]
    w = (q - zp) * scales.reshape(n, blocks, 1)
    return w.reshape(n, -1)[:, :k].T.copy()


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., width] -> float32 levels [..., width * 8 // bits] (low nibble first)."""
    if bits == 8:
        return packed.astype(np.float32)
    q = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), np.float32)
    q[..., 0::2] = packed & 0x0F
    q[..., 1::2] = packed >> 4
    return q


def weight_format(method: str, block_size: int | None = None) -> WeightFormat:
    """`method`'s format, with `block_size` (when given) instead of its default block."""
    f = WEIGHT_ONLY[method]
    return f if block_size is None else dataclasses.replace(f, block_size=block_size)


def embedding_format(method: str, block_size: int | None = None) -> WeightFormat:
    """How an int8 / int4 bundle stores its token embedding table (gathered row by row).

    int8: as its linears, so a tied LM head and the embedding share one copy of the bytes.
    int4: int8 blocks, a table of its own. An embedding row's rounding goes straight into the
    residual stream: int4 rows raised the trained target's KL to fp32 by 44% (0.0051 ->
    0.0074, past Q4_0's 0.0062; benchmarks.quant), int8 rows by nothing measurable."""
    return WEIGHT_ONLY["int8"] if method == "int4" else weight_format(method, block_size)


def fake_quantize(
    w: np.ndarray, method: str, block_size: int | None = None, embedding: bool = False
) -> np.ndarray:
    """w [in, out] as the exported graph sees it after weight quantization (block_size None:
    the method's default; embedding: w is an embedding table, transposed)."""
    f = (embedding_format if embedding else weight_format)(method, block_size)
    block = block_for(w.shape[0], f.block_size)
    packed, scales, zp = quantize_blocks(w, f.bits, block, f.zero_points)
    return dequantize_blocks(packed, scales, w.shape[0], f.bits, zp)
