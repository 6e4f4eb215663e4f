"""The integer work of one row of the row-per-warp kernels (ggml-cuda/mmvq-moe-rowwarp.cuh of series patch 0017, Q3_K
Q4_K and Q8_0; ggml-cuda/mmvq-cols.cuh of candidate 0023, Q6_K, and Q4_K with the MoE kernel's lanes), lane by lane, in
Python, against gguf-py's own dequantization: checks the lane -> (super-block, quarter) mapping, the activation
indices, the sub-block scale (and Q4_K min) decoding and the Q3_K minus-4 taken from the activations' byte sum,
before the kernels meet a GPU (the CUDA code itself is checked by harness.cu and test-backend-ops on the device).

    .venv/bin/python benchmarks/gpu/moe_kernel/rowwarp_math.py          # relerr ~0 for every row length
    .venv/bin/python benchmarks/gpu/moe_kernel/rowwarp_math.py --break  # a wrong shift / min formula: it fails
"""

from __future__ import annotations

import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def i32(buf: bytes, off: int) -> int:
    return struct.unpack_from("<i", buf, off)[0]


def dp4a(a: int, b: int, c: int) -> int:  # signed bytes, as ggml_cuda_dp4a
    bytes_a = struct.unpack("<4b", struct.pack("<i", a))
    bytes_b = struct.unpack("<4b", struct.pack("<i", b))
    return c + sum(x * y for x, y in zip(bytes_a, bytes_b))


def q8_1(x: np.ndarray) -> tuple[bytes, np.ndarray]:
    """quantize_q8_1 as MMVQ's input: per 32 values d = amax/127 (stored as half)."""
    q = np.zeros(x.size, np.int8)
    d8 = np.zeros(x.size // 32, np.float32)
    for ib in range(x.size // 32):
        blk = x[32 * ib : 32 * ib + 32]
        d = np.float32(np.abs(blk).max() / 127)
        d8[ib] = np.float16(d)
        q[32 * ib : 32 * ib + 32] = np.round(blk / d).astype(np.int8)
    return q.tobytes(), d8


def q3k_row(blocks: bytes, qb: bytes, d8: np.ndarray, broken: bool) -> float:
    total = 0.0
    for lane in range(32 * (len(blocks) // 110 // 8)):  # 8 super-blocks a pass, lane = 4*b + 2*n + h
        b0, n, h = lane >> 2, (lane >> 1) & 1, lane & 1
        base = 110 * b0
        qs = [i32(blocks, base + 32 + 32 * n + 16 * h + 4 * i) for i in range(4)]
        hm = [i32(blocks, base + 16 * h + 4 * i) for i in range(4)]
        sc = [i32(blocks, base + 96 + 4 * i) for i in range(3)]
        d = struct.unpack_from("<e", blocks, base + 108)[0]
        s = 0.0
        for j in range(4):
            yb = 8 * b0 + 4 * n + j
            u = [i32(qb, 32 * yb + 4 * (4 * h + i)) for i in range(4)]
            su = 0
            for i in range(4):
                su = dp4a(0x01010101, u[i], su)
            sumi = 0
            for i in range(4):
                vl = (qs[i] >> (2 * j)) & 0x03030303
                vh = ((hm[i] >> (4 * n + j)) & 0x01010101) << 2
                sumi = dp4a(vl | vh, u[i], sumi)
            sumi -= 4 * su
            byte = 2 * (j & 1) + h
            lo = (sc[j >> 1] >> (8 * byte + 4 * n)) & 0xF
            hi = (sc[2] >> (8 * byte + 2 * (2 * n + (j if broken else j >> 1)))) & 3
            s += float(d8[yb]) * float(sumi * ((lo | (hi << 4)) - 32))
        total += d * s
    return total


def q4k_row(blocks: bytes, qb: bytes, d8: np.ndarray, broken: bool) -> float:
    nb = len(blocks) // 144
    total = 0.0
    for lw in range(4 * nb):  # one row's lanes: lane = 4*b + c
        b0, c = lw >> 2, lw & 3
        base = 144 * b0
        head = [i32(blocks, base + 4 * i) & 0xFFFFFFFF for i in range(4)]
        qs = [i32(blocks, base + 16 + 32 * c + 4 * k) for k in range(8)]
        u = [[i32(qb, 32 * (8 * b0 + 2 * c + s) + 4 * k) for k in range(8)] for s in range(2)]
        su = [0, 0]
        for s in range(2):
            for k in range(8):
                su[s] = dp4a(0x01010101, u[s][k], su[s])
        jm = c & 1
        a, b, cc = ((head[i] >> (16 * jm)) & 0xFFFF for i in (1, 2, 3))
        sc = (a & 0x3F3F) if c < 2 else ((cc & 0x0F0F) | ((a & 0xC0C0) >> 2))
        m = (b & 0x3F3F) if c < 2 or broken else (((cc >> 4) & 0x0F0F) | ((b & 0xC0C0) >> 2))
        dlo = dhi = 0
        for k in range(8):
            dlo = dp4a(qs[k] & 0x0F0F0F0F, u[0][k], dlo)
            dhi = dp4a((qs[k] >> 4) & 0x0F0F0F0F, u[1][k], dhi)
        d, dmin = struct.unpack_from("<ee", blocks, base)
        y0, y1 = float(d8[8 * b0 + 2 * c]), float(d8[8 * b0 + 2 * c + 1])
        sum_d = y0 * dlo * (sc & 0xFF) + y1 * dhi * (sc >> 8)
        sum_m = y0 * su[0] * (m & 0xFF) + y1 * su[1] * (m >> 8)
        total += d * sum_d - dmin * sum_m
    return total


def vsub4(a: int, b: int) -> int:  # per-byte a - b, as __vsub4 (wrapping)
    bytes_a = struct.unpack("<4B", struct.pack("<i", a))
    bytes_b = struct.unpack("<4B", struct.pack("<i", b))
    return struct.unpack("<i", bytes((x - y) & 0xFF for x, y in zip(bytes_a, bytes_b)))[0]


def q6k_row(blocks: bytes, qb: bytes, d8: np.ndarray, broken: bool) -> float:
    total = 0.0
    for lane in range(32):  # lane = 4*b + 2*n + h; super-blocks b, b + 8, ... (a pass is 8 of them)
        b0, n, h = lane >> 2, (lane >> 1) & 1, lane & 1
        for kb in range(b0, len(blocks) // 210, 8):
            base = 210 * kb
            ql0 = [i32(blocks, base + 64 * n + 16 * h + 4 * i) for i in range(4)]
            ql1 = [i32(blocks, base + 64 * n + 32 + 16 * h + 4 * i) for i in range(4)]
            qh = [i32(blocks, base + 128 + 32 * n + 16 * h + 4 * i) for i in range(4)]
            sc2 = [i32(blocks, base + 192 + 8 * n + 4 * i) for i in range(2)]
            d = struct.unpack_from("<e", blocks, base + 208)[0]
            s = 0.0
            for g in range(4):
                sc = struct.unpack("<b", bytes([(sc2[g >> 1] >> (8 * (2 * (g & 1) + h))) & 0xFF]))[0]
                ib = 8 * kb + 4 * n + g
                sumi = 0
                for i in range(4):
                    vl = ((ql1[i] if g & 1 else ql0[i]) >> (4 * (g >> 1))) & 0x0F0F0F0F
                    vh = ((qh[i] >> (2 * (g if not broken else g >> 1))) & 0x03030303) << 4
                    sumi = dp4a(vsub4(vl | vh, 0x20202020), i32(qb, 32 * ib + 16 * h + 4 * i), sumi)
                s += float(d8[ib]) * float(sumi * sc)
            total += d * s
    return total


def q8_0_row(blocks: bytes, qb: bytes, d8: np.ndarray, broken: bool) -> float:
    total = 0.0
    for lw in range(len(blocks) // 68):  # a row's lanes: blocks 2*lw and 2*lw + 1, the lane's 17 words
        w = [i32(blocks, 68 * lw + 4 * i) for i in range(17)]
        dx0 = struct.unpack("<e", struct.pack("<H", w[0] & 0xFFFF))[0]
        dx1 = struct.unpack("<e", struct.pack("<H", (w[8] >> 16) & 0xFFFF))[0]
        s0 = s1 = 0
        for k in range(8):
            lo, hi = w[k] & 0xFFFFFFFF, w[k + 1] & 0xFFFFFFFF
            funnel = ((hi << 32 | lo) >> (8 if broken else 16)) & 0xFFFFFFFF  # __funnelshift_r(lo, hi, 16)
            s0 = dp4a(struct.unpack("<i", struct.pack("<I", funnel))[0], i32(qb, 32 * (2 * lw) + 4 * k), s0)
            s1 = dp4a(w[9 + k], i32(qb, 32 * (2 * lw + 1) + 4 * k), s1)
        total += dx0 * float(d8[2 * lw]) * s0 + dx1 * float(d8[2 * lw + 1]) * s1
    return total


def main(argv: list[str]) -> int:
    broken = "--break" in argv
    rng = np.random.default_rng(28)
    worst = 0.0
    for name, qtype, size, k, row in (
        ("q3_K", GGMLQuantizationType.Q3_K, 110, 2048, q3k_row),
        ("q4_K", GGMLQuantizationType.Q4_K, 144, 2048, q4k_row),
        ("q4_K", GGMLQuantizationType.Q4_K, 144, 512, q4k_row),
        ("q6_K", GGMLQuantizationType.Q6_K, 210, 2048, q6k_row),
        ("q6_K", GGMLQuantizationType.Q6_K, 210, 4096, q6k_row),
        ("q8_0", GGMLQuantizationType.Q8_0, 34, 2048, q8_0_row),
        ("q8_0", GGMLQuantizationType.Q8_0, 34, 512, q8_0_row),
    ):
        nb = k // (32 if size == 34 else 256)
        blocks = bytearray(rng.integers(0, 256, size * nb, dtype=np.uint8).tobytes())
        for b in range(nb):  # finite, small super-block scales (random bytes there can be inf/nan halves)
            for off in {110: (108,), 144: (0, 2), 210: (208,), 34: (0,)}[size]:
                struct.pack_into("<e", blocks, size * b + off, float(rng.uniform(0.002, 0.02)))
        w = dequantize(np.frombuffer(bytes(blocks), dtype=np.uint8), qtype).reshape(-1)
        qb, d8 = q8_1(rng.normal(size=k).astype(np.float32))
        ref = float(np.dot(w.astype(np.float64), np.frombuffer(qb, np.int8).astype(np.float64) * np.repeat(d8, 32)))
        got = row(bytes(blocks), qb, d8, broken)
        err = abs(got - ref) / abs(ref)
        worst = max(worst, err)
        print(f"{name} K={k:5d}  dequantized {ref:+.9f}  lanes {got:+.9f}  relerr {err:.1e}")
    return 0 if worst < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
