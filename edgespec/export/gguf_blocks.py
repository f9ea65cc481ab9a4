"""GGUF (llama.cpp) weight blocks -> onnxruntime `MatMulNBits` blocks, without re-quantizing.

Takes one GGUF tensor's raw rows (uint8 [N, bytes per row], N output features, K inputs per
row, as `gguf.GGUFReader` gives them) and its `GGMLQuantizationType`. `pack(rows, kind, k)`
returns a `PackedMatrix` holding the very integers and scales of the file, laid out as
MatMulNBits reads them (export/nbits.py: low nibble first, [N, blocks, block * bits / 8]),
or None for a type it cannot hold exactly. MatMulNBits computes (q - zero_point) * scale; a
block format with an additive minimum (q * d + m: Q4_1, Q5_1, Q4_K, Q5_K) keeps q and d there
with zero point 0 and its minima as a separate [K / block, N] term, which the graph adds as
x's block sums times the minima (builder.py). A float zero point -m / d would round, so the
minimum stays a minimum. Exact formats and their MatMulNBits container:

  Q8_0  8-bit, block 32, zero point 128 (the op's default) - q + 128 with scale d
  Q4_0  4-bit, block 32, zero point 8 (default)
  Q4_1  4-bit, block 32, zero point 0, minima m
  Q5_0  8-bit, block 32, zero point 16      Q5_1  8-bit, block 32, zero point 0, minima m
  Q4_K  4-bit, block 32 (the sub-blocks): scale d * sc and minimum -dmin * m, both exact
        products of an fp16 and a 6-bit integer in fp32, as ggml computes them
  Q5_K  8-bit, block 32, the same sub-block scales and minima
  Q6_K  8-bit, block 16, zero point 32, scale d * sc (sc int8)

  Q3_K  4-bit, block 16, zero point 4, scale d * (sc - 32)
  Q2_K  4-bit, block 16, zero point 0, scale d * sc, minimum -dmin * m

The IQ, ternary and FP4 types are not held: the importer dequantizes them (gguf's own
numpy dequantizer) and re-quantizes, measuring the error. `PackedMatrix.dequantize()` is
bit-identical to `gguf.quants.dequantize` for every held type (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgespec.export.nbits import WeightFormat, block_for, quantize_blocks

QK_K = 256


@dataclass(frozen=True)
class PackedMatrix:
    """W [K, N] (inputs x outputs, as the graph builders take float weights) in MatMulNBits
    blocks: `packed` uint8 [N, K / block, block * bits / 8], `scales` float32 [N, K / block],
    `zero_points` uint8 levels [N, K / block] (None: the op's default 2^(bits - 1)), `minima`
    float32 [N, K / block] added to every weight of its block (None: none), `source` the GGUF
    type name. `transposed`: this object stands for W.T (an embedding table [vocab, hidden])."""

    bits: int
    block: int
    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    minima: np.ndarray | None
    source: str
    transposed: bool = False

    @property
    def k(self) -> int:
        return self.scales.shape[1] * self.block

    @property
    def n(self) -> int:
        return self.scales.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.transposed else (self.k, self.n)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def T(self) -> PackedMatrix:  # noqa: N802 - numpy's name
        return replace(self, transposed=not self.transposed)

    def levels(self) -> np.ndarray:
        """The integers q, uint8 [N, K / block, block]."""
        if self.bits == 8:
            return self.packed
        q = np.empty((*self.packed.shape[:-1], 2 * self.packed.shape[-1]), np.uint8)
        q[..., 0::2] = self.packed & 0x0F
        q[..., 1::2] = self.packed >> 4
        return q

    def dequantize(self) -> np.ndarray:
        """float32 W [K, N] (or W.T): (q - zero point) * scale (+ minimum), as ggml computes."""
        zp = np.int16(2 ** (self.bits - 1)) if self.zero_points is None else self.zero_points
        q = self.levels().astype(np.int16) - (zp if np.ndim(zp) == 0 else zp[..., None])
        w = self.scales[..., None] * q.astype(np.float32)
        if self.minima is not None:
            w = w + self.minima[..., None]
        w = w.reshape(self.n, self.k)
        return np.ascontiguousarray(w if self.transposed else w.T)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        w = self.dequantize()
        return w if dtype is None else w.astype(dtype)

    def take_columns(self, order: np.ndarray) -> PackedMatrix:
        """Output features reordered (llama.cpp's Q/K row permutation undone): rows of blocks
        move whole, so the values stay exact."""
        return replace(
            self,
            packed=self.packed[order],
            scales=self.scales[order],
            zero_points=None if self.zero_points is None else self.zero_points[order],
            minima=None if self.minima is None else self.minima[order],
        )

    def scaled(self, factor: float) -> PackedMatrix:
        """Every weight times `factor` (scales and minima scaled: Granite's multipliers)."""
        f = np.float32(factor)
        mins = None if self.minima is None else self.minima * f
        return replace(self, scales=self.scales * f, minima=mins)

    def centred(self) -> PackedMatrix:
        """The same weights around the middle c of q's range: 4-bit levels shifted by 8 - c
        onto the op's default zero point 8 (so no 4-bit graph takes a zero point input), 8-bit
        ones with blocks with a minimum held as (q - c) * scale; whatever the zero points left
        goes into the minimum: (q - z) * s + m = (q' - 8) * s + (m + (c - z) * s). Why: with
        int8 activations x's rounding error e multiplies what MatMulNBits holds: e * q * scale,
        all of one sign, against e * (q - c) * scale, centred on 0 like the weights themselves,
        a quarter of the variance (on the SmolLM2 Q4_1 file KL to the file's float values
        0.0248 -> below llama.cpp's 0.0049, whose Q8_1 activations multiply the whole weight).
        And onnxruntime's AVX2 one-row int8 kernel for 4-bit blocks with zero points is
        reported wrong on CPUs without AVX-512 (onnxruntime #29853). The centre term (x's
        block sums times the minimum) is added in float; a minimum of 0 everywhere is none."""
        if self.zero_points is None:
            return self
        top = int(self.levels().max()) if self.packed.size else 1
        c = 1 << max(top.bit_length() - 1, 0)
        if self.bits == 8 and (self.minima is None or self.zero_points.any()):
            return self
        z = self.zero_points.astype(np.float32)
        minima = (0 if self.minima is None else self.minima) + (c - z) * self.scales
        minima = None if self.minima is None and not minima.any() else minima
        if self.bits == 8:
            return replace(self, zero_points=np.full(self.scales.shape, c, np.uint8),
                           minima=minima)  # fmt: skip
        return replace(self, packed=_pack4(self.levels() + np.uint8(8 - c)), zero_points=None,
                       minima=minima)  # fmt: skip

    def layout(self) -> tuple[int, int, bool, bool]:
        return (self.bits, self.block, self.zero_points is not None, self.minima is not None)

    def zero_point_tensor(self) -> np.ndarray | None:
        """The op's zero_points input: 4-bit levels two a byte per column (low first, each
        column padded to a whole byte), 8-bit one a byte; None for the default."""
        if self.zero_points is None:
            return None
        zp = self.zero_points
        if self.bits == 4:
            zp = np.pad(zp, ((0, 0), (0, zp.shape[1] % 2)))
            zp = zp[:, 0::2] | (zp[:, 1::2] << 4)
        return np.ascontiguousarray(zp).reshape(-1)


def concat_columns(parts: list[PackedMatrix]) -> PackedMatrix | None:
    """q|k|v or gate|up side by side in one layout (`common_layout`: the same values, bit
    for bit); None for a transposed part or blocks that do not nest."""
    if any(p.transposed for p in parts) or any(p.block % min(q.block for q in parts)
                                                 for p in parts):  # fmt: skip
        return None
    parts = common_layout(parts)

    def cat(field: str) -> np.ndarray | None:
        arrays = [getattr(p, field) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays, 0)

    return replace(
        parts[0],
        packed=cat("packed"),
        scales=cat("scales"),
        zero_points=cat("zero_points"),
        minima=cat("minima"),
        source="+".join(sorted({p.source for p in parts})),
    )


def common_layout(parts: list[PackedMatrix]) -> list[PackedMatrix]:
    """Parts of one fused matrix (a file's q, k and v, or gate and up, may be of different
    types: llama.cpp's Q4_K_M gives v and down more bits, and falls back to Q5_0 / Q8_0 where
    a row is no whole 256-weight super-block) in one layout, each weight's value unchanged:
    the widest levels (4-bit levels q with zero point z are 8-bit levels q with zero point
    z), the smallest block (a block of 32 is two of 16, each with its scale, zero point and
    minimum), explicit zero points where any part or width differs (the default 2^(bits-1)
    spelt out), zero minima where any part has minima. Otherwise the fused matrix would be
    held as float32: 4 bytes a weight against at most 1.25."""
    if len({p.layout() for p in parts}) == 1:
        return parts
    bits = max(p.bits for p in parts)
    block = min(p.block for p in parts)
    explicit = len({p.bits for p in parts}) > 1 or any(p.zero_points is not None for p in parts)
    minima = any(p.minima is not None for p in parts)
    out = []
    for p in parts:
        levels, per = p.levels(), p.block // block
        zp = p.zero_points
        if explicit and zp is None:
            zp = np.full(p.scales.shape, 1 << (p.bits - 1), np.uint8)
        mins = p.minima if p.minima is not None or not minima else np.zeros_like(p.scales)
        n = levels.shape[0]
        levels = levels.reshape(n, -1, block)
        packed = levels if bits == 8 else _pack4(levels)
        scales, zp, mins = (None if a is None else np.repeat(a, per, axis=1)
                            for a in (p.scales, zp, mins))  # fmt: skip
        out.append(replace(p, bits=bits, block=block, packed=np.ascontiguousarray(packed),
                           scales=scales, zero_points=zp, minima=mins))  # fmt: skip
    return out


def from_float(w: np.ndarray, f: WeightFormat) -> PackedMatrix | None:
    """Float W [K, N] quantized as `f` (export/nbits.py), as a PackedMatrix, so that the graph
    holds it as it holds a GGUF file's blocks (`centred`); None where K needs padding to whole
    blocks."""
    k, n = w.shape
    block = block_for(k, f.block_size)
    if k % block:
        return None
    packed, scales, zp = quantize_blocks(w, f.bits, block, f.zero_points)
    if zp is not None and f.bits == 4:
        zp = np.stack([zp & 0x0F, zp >> 4], -1).reshape(n, -1)[:, : k // block]
    zp = None if zp is None else zp.reshape(n, k // block)
    return PackedMatrix(f.bits, block, packed, scales.reshape(n, -1), zp, None, f"int{f.bits}")


def _f16(raw: np.ndarray) -> np.ndarray:
    """uint8 [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 4-bit order (element j low nibble of byte j, element j + 16 its high nibble)
    -> levels uint8 [..., 2 * bytes] in element order."""
    return np.concatenate([qs & 0x0F, qs >> 4], -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Q5_0/Q5_1's 32 fifth bits, little-endian bit order, as 0/16."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")[..., :count]
    return (bits << 4).astype(np.uint8)


def _pack4(q: np.ndarray) -> np.ndarray:
    """levels [..., block] -> MatMulNBits' bytes (element 2j low nibble, 2j + 1 high)."""
    return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))


def _scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit minima (ggml's get_scale_min_k4)."""
    s = scales.reshape(*scales.shape[:-1], 3, 4)
    d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return sc.astype(np.float32), mn.astype(np.float32)


def pack(rows: np.ndarray, kind: str, k: int) -> PackedMatrix | None:
    """One GGUF tensor's raw rows uint8 [N, row bytes] as MatMulNBits blocks (see module doc)."""
    n = rows.shape[0]
    if kind in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        b = rows.reshape(n, k // 32, -1)
        d = _f16(b[..., 0:2])
        if kind == "Q8_0":
            q = (b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            return PackedMatrix(8, 32, q, d, None, None, kind)
        if kind == "Q4_0":
            return PackedMatrix(4, 32, _pack4(_nibbles(b[..., 2:18])), d, None, None, kind)
        if kind == "Q4_1":
            q, m = _nibbles(b[..., 4:20]), _f16(b[..., 2:4])
            return PackedMatrix(4, 32, _pack4(q), d, np.zeros(d.shape, np.uint8), m, kind)
        if kind == "Q5_0":
            q = _nibbles(b[..., 6:22]) | _high_bits(b[..., 2:6], 32)
            return PackedMatrix(8, 32, q, d, np.full(d.shape, 16, np.uint8), None, kind)
        m = _f16(b[..., 2:4])
        q = _nibbles(b[..., 8:24]) | _high_bits(b[..., 4:8], 32)
        return PackedMatrix(8, 32, q, d, np.zeros(d.shape, np.uint8), m, kind)
    if kind in ("Q4_K", "Q5_K"):
        b = rows.reshape(n, k // QK_K, -1)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _scale_min(b[..., 4:16])
        scale = (d[..., None] * sc).reshape(n, -1)
        minima = -(dmin[..., None] * mn).reshape(n, -1)
        if kind == "Q4_K":  # 4 chunks of 32 bytes: low nibbles sub-block 2j, high 2j + 1
            qs = b[..., 16:144].reshape(n, -1, 4, 32)
            q = np.stack([qs & 0x0F, qs >> 4], 3).reshape(n, -1, 32)
            return PackedMatrix(4, 32, _pack4(q), scale, np.zeros(scale.shape, np.uint8),
                                minima, kind)  # fmt: skip
        qh = b[..., 16:48]  # bit j of byte i: the fifth bit of element i of sub-block j
        qs = b[..., 48:176].reshape(n, -1, 4, 32)
        low = np.stack([qs & 0x0F, qs >> 4], 3).reshape(n, -1, 8, 32)
        high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
        q = (low | (high << 4)).reshape(n, -1, 32)
        return PackedMatrix(8, 32, q, scale, np.zeros(scale.shape, np.uint8), minima, kind)
    if kind == "Q6_K":
        b = rows.reshape(n, k // QK_K, -1)
        ql, qh = b[..., 0:128].reshape(n, -1, 2, 64), b[..., 128:192].reshape(n, -1, 2, 32)
        sc = b[..., 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[..., 208:210])
        low = np.stack([ql & 0x0F, ql >> 4], 3).reshape(n, -1, 2, 4, 32)
        shifts = np.array([0, 2, 4, 6], np.uint8)[:, None]
        high = (qh[..., None, :] >> shifts) & 3  # [n, blocks, 2, 4, 32]
        q = (low | (high << 4)).reshape(n, -1, 16)
        scale = (d[..., None] * sc).reshape(n, -1)
        return PackedMatrix(8, 16, q, scale, np.full(scale.shape, 32, np.uint8), None, kind)
    if kind in ("Q2_K", "Q3_K"):
        return _low_bit_k(rows.reshape(n, k // QK_K, -1), kind)
    return None


def _low_bit_k(b: np.ndarray, kind: str) -> PackedMatrix:
    """Q2_K (2-bit q, 4-bit scale and minimum per 16) and Q3_K (3-bit q, 6-bit signed scale
    per 16) in 4-bit containers with blocks of 16."""
    n = b.shape[0]
    two = np.array([0, 2, 4, 6], np.uint8)[:, None]
    if kind == "Q2_K":
        scales, qs = b[..., 0:16], b[..., 16:80].reshape(n, -1, 2, 1, 32)
        d, dmin = _f16(b[..., 80:82]), _f16(b[..., 82:84])
        q = ((qs >> two) & 3).reshape(n, -1, 16)
        scale = (d[..., None] * (scales & 0x0F).astype(np.float32)).reshape(n, -1)
        minima = -(dmin[..., None] * (scales >> 4).astype(np.float32)).reshape(n, -1)
        return PackedMatrix(4, 16, _pack4(q), scale, np.zeros(scale.shape, np.uint8), minima, kind)
    hmask, qs = b[..., 0:32].reshape(n, -1, 1, 32), b[..., 32:96].reshape(n, -1, 2, 1, 32)
    raw, d = b[..., 96:108], _f16(b[..., 108:110])
    low = raw[..., 0:8].reshape(n, -1, 1, 8) >> np.array([0, 4], np.uint8)[:, None]
    high = raw[..., 8:12].reshape(n, -1, 1, 4) >> two
    sc = (low.reshape(n, -1, 16) & 0x0F) | ((high.reshape(n, -1, 16) & 3) << 4)
    scale = (d[..., None] * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)).reshape(n, -1)
    ql = ((qs >> two) & 3).reshape(n, -1, 16)
    qh = ((hmask >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(n, -1, 16)
    q = ql + (qh << 2)  # q - 4 is ggml's signed value: its high bit set means no offset
    return PackedMatrix(4, 16, _pack4(q), scale, np.full(scale.shape, 4, np.uint8), None, kind)
