"""simd: the few explicit vector operations the Numba kernels need, written as LLVM IR (Numba intrinsics).

Why not plain Numba loops: a 16- or 32-wide loop with a constant trip count is fully unrolled by LLVM
before its loop vectorizer runs, and the SLP vectorizer then refuses to merge the scalar lanes because
a store to one Numba array may alias a load from another (Numba marks no array `noalias`). That scalar
code left the K-quant decoders compute-bound far below memory speed (LESSONS 7; docs/performance-log.md
old 19). Each intrinsic here loads its operands as one vector, computes, and stores - one `<16 x float>`
fma is one AVX-512 instruction, two AVX2 ones, four NEON ones: LLVM legalizes the width for the host CPU.

Every operation is an ordinary IEEE float32 operation in a fixed order: fmul, fsub, uitofp/sitofp of
small integers (exact), llvm.fma (rounded once), fadd in a fixed tree. No fast-math flags, so LLVM may
neither reassociate nor contract; the bits a lane gets do not depend on the vector width.

Arrays are addressed as `a.flat[i:i + n]`: the array must be C-contiguous (checked at typing) and the
caller keeps `i + n <= a.size` (these are inner-loop primitives: no bounds check).

    fma16(acc, i, w, j, x, k)          acc[i:i+16] = fma(w[j:j+16], x[k:k+16], acc[i:i+16])   (and fma256)
    lane_sum256(a, i), lane_sum16   a[i] + ... + a[i+255] (or +15) as a fixed pairwise tree: (l, l+128), (l, l+64), ...
    dot256(a, i, b, j), dot16          the products a[i+l] * b[j+l], rounded, summed by that tree (in registers)
    axpy256(y, i, s, x, j), axpy16     y[i:i+256] = fma(s, x[j:j+256], y[i:i+256]) for a scalar s
    half_to_f32(u8, i)                 the fp16 at bytes u8[i], u8[i+1] (little endian) as float32, exact
    affine_u4(u8, i, w, j, s0, m0, s1, m1)   32 bytes -> w[j:j+32] = s0 * (b & 15) - m0, w[j+32:j+64] = s1 * (b >> 4) - m1
    ...and the block-specific decoders below (Q4_K scales, Q5_K fifth bit, Q6_K, Q8_0, Q4_0, IQ2 codewords).
"""

from __future__ import annotations

import os

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

F32, I8, I16, I32, I64 = ir.FloatType(), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _vec(el, n):
    return ir.VectorType(el, n)


def _is_c_array(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.layout == "C" and ty.dtype == dtype


def _ptr(context, builder, aryty, ary, i):  # &a.flat[i]
    return builder.gep(context.make_array(aryty)(context, builder, ary).data, [i])


def _load(context, builder, aryty, ary, i, n):  # a.flat[i:i+n] as one <n x T> value
    p = _ptr(context, builder, aryty, ary, i)
    return builder.load(builder.bitcast(p, _vec(p.type.pointee, n).as_pointer()), align=1)


def _store(context, builder, aryty, ary, i, v):  # a.flat[i:i+len(v)] = v
    p = _ptr(context, builder, aryty, ary, i)
    builder.store(v, builder.bitcast(p, v.type.as_pointer()), align=1)


def _add(builder, i, k: int):
    return builder.add(i, ir.Constant(i.type, k))


def _const(el, n, c):
    return ir.Constant(_vec(el, n), [c] * n)


def _shuffle(builder, v, lanes):  # <len(lanes) x T>: v[lanes[0]], v[lanes[1]], ...
    return builder.shuffle_vector(v, v, ir.Constant(_vec(I32, len(lanes)), list(lanes)))


def _splat(builder, s, n):
    v = builder.insert_element(ir.Constant(_vec(s.type, n), ir.Undefined), s, ir.Constant(I32, 0))
    return _shuffle(builder, v, [0] * n)


def _fma(builder, a, b, c):  # llvm.fma on vectors: a * b + c rounded once per lane
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fma.v{a.type.count}f32"),
                        [a, b, c])


def _scale(builder, codes, signed: bool, s, m=None):  # s * float(codes) [- m]: the oracle's order
    f = (builder.sitofp if signed else builder.uitofp)(codes, _vec(F32, codes.type.count))
    r = builder.fmul(_splat(builder, s, codes.type.count), f)
    return r if m is None else builder.fsub(r, _splat(builder, m, codes.type.count))


def _cat(builder, a, b):  # <n x T> ++ <n x T> -> <2n x T>
    n = a.type.count
    return builder.shuffle_vector(a, b, ir.Constant(_vec(I32, 2 * n), list(range(2 * n))))


def _void(context):
    return context.get_dummy_value()


def _fma_n(n: int):
    @intrinsic
    def fma_n(typingctx, acc, i, w, j, x, k):
        if not all(_is_c_array(a, types.float32) for a in (acc, w, x)):
            return None

        def codegen(context, builder, sig, args):
            ta, _, tw, _, tx, _ = sig.args
            a, i, w, j, x, k = args  # all loads, then the fmas, then the stores: one basic block
            r = _fma(builder, _load(context, builder, tw, w, j, n), _load(context, builder, tx, x, k, n),
                     _load(context, builder, ta, a, i, n))
            _store(context, builder, ta, a, i, r)
            return _void(context)

        return types.void(acc, i, w, j, x, k), codegen

    fma_n.__doc__ = f"acc[i:i+{n}] = fma(w[j:j+{n}], x[k:k+{n}], acc[i:i+{n}])."
    return fma_n


fma16, fma256 = _fma_n(16), _fma_n(256)


@intrinsic
def fma_spans256(typingctx, acc, w, j, x, k, n):
    """acc[0:256] = the lanes of sum over spans s < n of w[j + 256 s + l] * x[k + 256 s + l]: lane l starts
    at +0 and takes fma(w, x, lane) span by span, in registers (16 <16 x float> accumulators), stored once
    at the end. The same lanes, in the same order, as n calls of fma256 on a zeroed acc in memory, without
    a load and a store of every accumulator per span."""
    if not all(_is_c_array(a, types.float32) for a in (acc, w, x)):
        return None

    def codegen(context, builder, sig, args):
        ta, tw, _, tx, _, _ = sig.args
        a, wv, j, xv, k, n = args
        v16 = _vec(F32, 16)
        lanes = [cgutils.alloca_once_value(builder, ir.Constant(v16, None)) for _ in range(16)]  # SROA: registers
        with cgutils.for_range(builder, n) as loop:
            o = builder.mul(loop.index, ir.Constant(loop.index.type, 256))
            for v, slot in enumerate(lanes):
                wl = _load(context, builder, tw, wv, _add(builder, builder.add(j, o), 16 * v), 16)
                xl = _load(context, builder, tx, xv, _add(builder, builder.add(k, o), 16 * v), 16)
                builder.store(_fma(builder, wl, xl, builder.load(slot)), slot)
        for v, slot in enumerate(lanes):
            _store(context, builder, ta, a, ir.Constant(I64, 16 * v), builder.load(slot))
        return _void(context)

    return types.void(acc, w, j, x, k, n), codegen


def _tree_sum(builder, v):  # <n x float> -> v[0] + ... + v[n-1] by the fixed tree v[l] += v[l + h], h = n/2, ..., 1
    n = v.type.count
    while n > 1:
        n //= 2
        v = builder.fadd(_shuffle(builder, v, range(n)), _shuffle(builder, v, range(n, 2 * n)))
    return builder.extract_element(v, ir.Constant(I32, 0))


def _lane_sum_n(width: int):
    @intrinsic
    def lane_sum(typingctx, a, i):
        if not _is_c_array(a, types.float32):
            return None

        def codegen(context, builder, sig, args):
            return _tree_sum(builder, _load(context, builder, sig.args[0], args[0], args[1], width))

        return types.float32(a, i), codegen

    lane_sum.__doc__ = (f"a[i] + ... + a[i + {width - 1}] by the fixed tree v[l] += v[l + h], "
                        f"h = {width // 2}, {width // 4}, ..., 1.")
    return lane_sum


lane_sum16, lane_sum256 = _lane_sum_n(16), _lane_sum_n(256)


@intrinsic
def lane_sum16_swapped(typingctx, a, i):
    """lane_sum16 of a[i:i+16] read in the order LANE_SWAP (the wide Q4_K kernel's lanes): the same tree
    over the same values as lane_sum16 gives them in value-layout order."""
    if not _is_c_array(a, types.float32):
        return None

    def codegen(context, builder, sig, args):
        return _tree_sum(builder, _shuffle(builder, _load(context, builder, sig.args[0], args[0], args[1], 16),
                                           LANE_SWAP))

    return types.float32(a, i), codegen


def _dot_n(width: int):
    @intrinsic
    def dot(typingctx, a, i, b, j):
        if not (_is_c_array(a, types.float32) and _is_c_array(b, types.float32)):
            return None

        def codegen(context, builder, sig, args):
            ta, _, tb, _ = sig.args
            return _tree_sum(builder, builder.fmul(_load(context, builder, ta, args[0], args[1], width),
                                                   _load(context, builder, tb, args[2], args[3], width)))

        return types.float32(a, i, b, j), codegen

    dot.__doc__ = (f"a[i:i+{width}] . b[j:j+{width}]: the products rounded, then summed by lane_sum{width}'s "
                   "fixed tree, all in registers.")
    return dot


def _axpy_n(width: int):
    @intrinsic
    def axpy(typingctx, y, i, s, x, j):
        if not (_is_c_array(y, types.float32) and _is_c_array(x, types.float32) and s == types.float32):
            return None

        def codegen(context, builder, sig, args):
            ty, _, _, tx, _ = sig.args
            yv, i, sv, xv, j = args
            r = _fma(builder, _splat(builder, sv, width), _load(context, builder, tx, xv, j, width),
                     _load(context, builder, ty, yv, i, width))
            _store(context, builder, ty, yv, i, r)
            return _void(context)

        return types.void(y, i, s, x, j), codegen

    axpy.__doc__ = f"y[i:i+{width}] = fma(s, x[j:j+{width}], y[i:i+{width}]) for a float32 scalar s."
    return axpy


dot16, dot256 = _dot_n(16), _dot_n(256)
axpy16, axpy256 = _axpy_n(16), _axpy_n(256)


@intrinsic
def half_to_f32(typingctx, u8, i):
    """The IEEE half at u8[i], u8[i + 1] (little endian) widened to float32: exact (F16C vcvtph2ps)."""
    if not _is_c_array(u8, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        return _half(context, builder, sig.args[0], args[0], args[1])

    return types.float32(u8, i), codegen


@intrinsic
def halves16(typingctx, u8, i, w, j):
    """w[j:j+16] = the 16 IEEE halves at u8[i:i+32] widened to float32, bit for bit NumPy's float16 ->
    float32: one vcvtph2ps, which quiets a signalling NaN (sets the top mantissa bit), so that bit is
    cleared again where the half was a signalling NaN (exponent 31, mantissa != 0, top mantissa bit 0)."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, tw, _ = sig.args
        u, i, wv, j = args
        p = _ptr(context, builder, tu, u, i)
        h = builder.load(builder.bitcast(p, _vec(ir.HalfType(), 16).as_pointer()), align=1)
        bits = builder.bitcast(h, _vec(I16, 16))
        c = lambda v: _const(I16, 16, v)  # noqa: E731
        snan = builder.and_(builder.icmp_unsigned("==", builder.and_(bits, c(0x7E00)), c(0x7C00)),
                            builder.icmp_unsigned("!=", builder.and_(bits, c(0x01FF)), c(0)))
        f = builder.bitcast(builder.fpext(h, _vec(F32, 16)), _vec(I32, 16))
        f = builder.select(snan, builder.and_(f, _const(I32, 16, 0xFFBFFFFF)), f)
        _store(context, builder, tw, wv, j, builder.bitcast(f, _vec(F32, 16)))
        return _void(context)

    return types.void(u8, i, w, j), codegen


def _half(context, builder, tu, u, i):  # the fp16 at bytes u8[i], u8[i+1] as a float32 value (exact)
    return builder.fpext(builder.load(builder.bitcast(_ptr(context, builder, tu, u, i), ir.HalfType().as_pointer()),
                                      align=1), F32)


@intrinsic
def affine_u4(typingctx, u8, i, w, j, s0, m0, s1, m1):
    """Q4_K: 32 bytes at u8[i] -> w[j:j+32] = s0 * (b & 15) - m0 and w[j+32:j+64] = s1 * (b >> 4) - m1."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, tw = sig.args[:3]
        u, i, w, j, s0, m0, s1, m1 = args
        b = _load(context, builder, tu, u, i, 32)
        _store(context, builder, tw, w, j, _scale(builder, builder.and_(b, _const(I8, 32, 15)), False, s0, m0))
        _store(context, builder, tw, w, _add(builder, j, 32),
               _scale(builder, builder.lshr(b, _const(I8, 32, 4)), False, s1, m1))
        return _void(context)

    return types.void(u8, i, w, j, s0, m0, s1, m1), codegen


@intrinsic
def affine_u5(typingctx, u8, i, ih, c, w, j, s0, m0, s1, m1):
    """Q5_K: as affine_u4 for the 32 bytes at u8[i], plus a fifth bit (16) from the 32 bytes at u8[ih]:
    bit 2c for the low nibbles, bit 2c + 1 for the high ones."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, _, _, tw = sig.args[:5]
        u, i, ih, c, w, j, s0, m0, s1, m1 = args
        b, h = _load(context, builder, tu, u, i, 32), _load(context, builder, tu, u, ih, 32)
        sh = _splat(builder, builder.trunc(builder.mul(c, ir.Constant(c.type, 2)), I8), 32)
        one, four = _const(I8, 32, 1), _const(I8, 32, 4)
        hi0 = builder.shl(builder.and_(builder.lshr(h, sh), one), four)
        hi1 = builder.shl(builder.and_(builder.lshr(h, builder.add(sh, one)), one), four)
        q0 = builder.or_(builder.and_(b, _const(I8, 32, 15)), hi0)
        q1 = builder.or_(builder.lshr(b, four), hi1)
        _store(context, builder, tw, w, j, _scale(builder, q0, False, s0, m0))
        _store(context, builder, tw, w, _add(builder, j, 32), _scale(builder, q1, False, s1, m1))
        return _void(context)

    return types.void(u8, i, ih, c, w, j, s0, m0, s1, m1), codegen


def _k_scale_codes(builder, q):  # the 12 scale bytes <12 x i8> -> sc, m as two <8 x i8> (0..63)
    k = lambda c: _const(I8, 8, c)  # noqa: E731
    a, b = _shuffle(builder, q, [0, 1, 2, 3, 8, 9, 10, 11]), _shuffle(builder, q, [0, 0, 0, 0, 0, 1, 2, 3])
    c, e = _shuffle(builder, q, [4, 5, 6, 7, 8, 9, 10, 11]), _shuffle(builder, q, [0, 0, 0, 0, 4, 5, 6, 7])
    low = ir.Constant(_vec(ir.IntType(1), 8), [1, 1, 1, 1, 0, 0, 0, 0])
    sc = builder.select(low, builder.and_(a, k(63)),
                        builder.or_(builder.and_(a, k(15)), builder.shl(builder.lshr(b, k(6)), k(4))))
    m = builder.select(low, builder.and_(c, k(63)),
                       builder.or_(builder.lshr(c, k(4)), builder.shl(builder.lshr(e, k(6)), k(4))))
    return sc, m


@intrinsic
def k_scales(typingctx, u8, i, d, dmin, sm):
    """Q4_K/Q5_K: the 12 scale bytes at u8[i] hold eight 6-bit (sc, m) pairs ->
    sm[0:8] = d * sc[0:8], sm[8:16] = dmin * m[0:8]. Pair j < 4: sc = q[j] & 63, m = q[j + 4] & 63;
    j >= 4: sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m = (q[j + 4] >> 4) | (q[j] >> 6) << 4."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(sm, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, _, _, ts = sig.args
        u, i, d, dmin, sm = args
        sc, m = _k_scale_codes(builder, _load(context, builder, tu, u, i, 12))
        f = builder.fmul(_cat(builder, _splat(builder, d, 8), _splat(builder, dmin, 8)),
                         builder.uitofp(_cat(builder, sc, m), _vec(F32, 16)))
        _store(context, builder, ts, sm, ir.Constant(I64, 0), f)
        return _void(context)

    return types.void(u8, i, d, dmin, sm), codegen


def _scaled_i8(n: int):
    @intrinsic
    def scaled_i8(typingctx, u8, i, d, w, j):
        if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
            return None

        def codegen(context, builder, sig, args):
            tu, _, _, tw, _ = sig.args
            u, i, d, w, j = args
            _store(context, builder, tw, w, j, _scale(builder, _load(context, builder, tu, u, i, n), True, d))
            return _void(context)

        return types.void(u8, i, d, w, j), codegen

    scaled_i8.__doc__ = f"w[j:j+{n}] = d * int8(u8[i:i+{n}]) (Q8_0 values, Q6_K scales)."
    return scaled_i8


scaled_i8_16, scaled_i8_32 = _scaled_i8(16), _scaled_i8(32)


@intrinsic
def affine_q4_0(typingctx, u8, i, d, w, j):
    """Q4_0: 16 bytes at u8[i] -> w[j:j+16] = d * ((b & 15) - 8), w[j+16:j+32] = d * ((b >> 4) - 8)."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, _, tw, _ = sig.args
        u, i, d, w, j = args
        b, eight = _load(context, builder, tu, u, i, 16), _const(I8, 16, 8)
        lo = builder.sub(builder.and_(b, _const(I8, 16, 15)), eight)
        hi = builder.sub(builder.lshr(b, _const(I8, 16, 4)), eight)
        _store(context, builder, tw, w, j, _scale(builder, lo, True, d))
        _store(context, builder, tw, w, _add(builder, j, 16), _scale(builder, hi, True, d))
        return _void(context)

    return types.void(u8, i, d, w, j), codegen


def _byte(builder, v):  # a Numba integer argument as an i8 (a shift count for <n x i8> lanes)
    return builder.trunc(v, I8) if v.type.width > 8 else v


def _store_halves(context, builder, tw, w, j, q, signed, s0, s1, m0=None, m1=None):
    # <32 x i8> codes q -> w[j:j+16] = s0 * q[0:16] [- m0], w[j+16:j+32] = s1 * q[16:32] [- m1] (the oracle's order)
    lo, hi = _shuffle(builder, q, range(16)), _shuffle(builder, q, range(16, 32))
    _store(context, builder, tw, w, j, _scale(builder, lo, signed, s0, m0))
    _store(context, builder, tw, w, _add(builder, j, 16), _scale(builder, hi, signed, s1, m1))


@intrinsic
def affine_u2(typingctx, u8, i, shift, w, j, s0, m0, s1, m1):
    """Q2_K, one 32-value group: 2-bit fields (b >> shift) & 3 of the 32 bytes at u8[i] ->
    w[j:j+16] = s0 * q - m0 (bytes 0-15), w[j+16:j+32] = s1 * q - m1 (bytes 16-31)."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, _, tw = sig.args[:4]
        u, i, shift, w, j, s0, m0, s1, m1 = args
        b = _load(context, builder, tu, u, i, 32)
        q = builder.and_(builder.lshr(b, _splat(builder, _byte(builder, shift), 32)), _const(I8, 32, 3))
        _store_halves(context, builder, tw, w, j, q, False, s0, s1, m0, m1)
        return _void(context)

    return types.void(u8, i, shift, w, j, s0, m0, s1, m1), codegen


@intrinsic
def q3_k_group(typingctx, u8, qi, hi, shift, k, w, j, d0, d1):
    """Q3_K, one 32-value group: q = ((u8[qi + l] >> shift) & 3) - (0 if bit k of u8[hi + l] else 4), l < 32
    -> w[j:j+16] = d0 * q[0:16], w[j+16:j+32] = d1 * q[16:32]."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, tw = sig.args[0], sig.args[5]
        u, qi, hi, shift, k, w, j, d0, d1 = args
        sh, kk = _byte(builder, shift), _byte(builder, k)
        low = builder.and_(builder.lshr(_load(context, builder, tu, u, qi, 32), _splat(builder, sh, 32)),
                           _const(I8, 32, 3))
        bit = builder.and_(builder.lshr(_load(context, builder, tu, u, hi, 32), _splat(builder, kk, 32)),
                           _const(I8, 32, 1))
        q = builder.sub(low, builder.mul(builder.sub(_const(I8, 32, 1), bit), _const(I8, 32, 4)))  # -4..3
        _store_halves(context, builder, tw, w, j, q, True, d0, d1)
        return _void(context)

    return types.void(u8, qi, hi, shift, k, w, j, d0, d1), codegen


KVALUES_IQ4 = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # iq_grids.KVALUES_IQ4NL


@intrinsic
def iq4_block32(typingctx, u8, i, d, w, j):
    """IQ4_NL / IQ4_XS, 32 values: the 16 bytes at u8[i] hold codes c (value l: low nibble of byte l, value
    l + 16: high nibble) -> w[j:j+32] = d * KVALUES_IQ4[c]. The 16-entry lookup is a tree of 15 selects on
    the code's bits (portable IR: no variable shuffle), on int8 levels, then one exact convert and multiply."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, _, tw, _ = sig.args
        u, i, d, w, j = args
        b = _load(context, builder, tu, u, i, 16)
        c = _cat(builder, builder.and_(b, _const(I8, 16, 15)), builder.lshr(b, _const(I8, 16, 4)))  # <32 x i8>
        level = [_const(I8, 32, v) for v in KVALUES_IQ4]
        for bit in range(4):  # pick by bit 0, then 1, 2, 3: 8 + 4 + 2 + 1 selects
            on = builder.icmp_unsigned("!=", builder.and_(c, _const(I8, 32, 1 << bit)), _const(I8, 32, 0))
            level = [builder.select(on, level[2 * k + 1], level[2 * k]) for k in range(len(level) // 2)]
        _store(context, builder, tw, w, j, _scale(builder, level[0], True, d))
        return _void(context)

    return types.void(u8, i, d, w, j), codegen


def _grid_signed(n: int):
    @intrinsic
    def grid_signed(typingctx, grid, gi, sign, si, d, w, j):
        if not all(_is_c_array(t, types.float32) for t in (grid, sign, w)):
            return None

        def codegen(context, builder, sig, args):
            tg, _, ts, _, _, tw, _ = sig.args
            g, gi, sg, si, d, w, j = args
            v = builder.fmul(_splat(builder, d, n), _load(context, builder, tg, g, gi, n))
            _store(context, builder, tw, w, j, builder.fmul(v, _load(context, builder, ts, sg, si, n)))
            return _void(context)

        return types.void(grid, gi, sign, si, d, w, j), codegen

    grid_signed.__doc__ = (f"IQ2/IQ3 codewords: w[j:j+{n}] = (d * grid.flat[gi:gi+{n}]) * sign.flat[si:si+{n}] "
                           "(sign: +-1 floats).")
    return grid_signed


grid_signed4, grid_signed8 = _grid_signed(4), _grid_signed(8)  # IQ3_XXS / IQ3_S, IQ2_* codeword widths


@intrinsic
def grid_shifted8(typingctx, grid, gi, delta, d, w, j):
    """IQ1 codewords: w[j:j+8] = d * (grid.flat[gi:gi+8] + delta) (grid in {-1, 0, 1}, delta +-1/8: exact)."""
    if not (_is_c_array(grid, types.float32) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tg, _, _, _, tw, _ = sig.args
        g, gi, delta, d, w, j = args
        v = builder.fadd(_load(context, builder, tg, g, gi, 8), _splat(builder, delta, 8))
        _store(context, builder, tw, w, j, builder.fmul(_splat(builder, d, 8), v))
        return _void(context)

    return types.void(grid, gi, delta, d, w, j), codegen


def _legacy_block(size: int, offset: bool, qh: int):
    # Q4_1 (20 bytes: d, m, qs), Q5_0 (22: d, qh, qs), Q5_1 (24: d, m, qh, qs): 32 values (legacy.py)
    @intrinsic
    def legacy_block(typingctx, u8, o, w, j):
        if not (_is_c_array(u8, types.uint8) and _is_c_array(w, types.float32)):
            return None

        def codegen(context, builder, sig, args):
            tu, _, tw, _ = sig.args
            u, o, w, j = args
            b = _load(context, builder, tu, u, _add(builder, o, size - 16), 16)
            q = _cat(builder, builder.and_(b, _const(I8, 16, 15)), builder.lshr(b, _const(I8, 16, 4)))  # <32 x i8>
            if qh >= 0:  # bit l of the uint32 at qh: the fifth bit (16) of value l
                h = builder.load(builder.bitcast(_ptr(context, builder, tu, u, _add(builder, o, qh)),
                                                 I32.as_pointer()), align=1)
                bits = builder.and_(builder.lshr(_splat(builder, h, 32), ir.Constant(_vec(I32, 32), list(range(32)))),
                                    _const(I32, 32, 1))
                q = builder.or_(q, builder.shl(builder.trunc(bits, _vec(I8, 32)), _const(I8, 32, 4)))
            d = _half(context, builder, tu, u, o)
            if offset:  # d * q + m, as d * q - (-m): the same IEEE operation
                v = _scale(builder, q, False, d, builder.fneg(_half(context, builder, tu, u, _add(builder, o, 2))))
            else:  # d * (q - 16)
                v = _scale(builder, builder.sub(q, _const(I8, 32, 16)), True, d)
            _store(context, builder, tw, w, j, v)
            return _void(context)

        return types.void(u8, o, w, j), codegen

    return legacy_block


q4_1_block, q5_0_block = _legacy_block(20, True, -1), _legacy_block(22, False, 2)
q5_1_block = _legacy_block(24, True, 4)
q4_1_block.__doc__ = "Q4_1: the 20-byte block at u8[o] -> w[j:j+32] = d * q + m."
q5_0_block.__doc__ = "Q5_0: the 22-byte block at u8[o] -> w[j:j+32] = d * (q - 16), q with its fifth bit from qh."
q5_1_block.__doc__ = "Q5_1: the 24-byte block at u8[o] -> w[j:j+32] = d * q + m, q with its fifth bit from qh."


@intrinsic
def q6_k_half(typingctx, u8, lo, hi, sc, k, w, j):
    """Q6_K, one half of a block: 64 low-bit bytes at u8[lo], 32 high-bit bytes at u8[hi] -> 128 values
    w[j + 32 m + l] = sc[k + 2 m + (l >= 16)] * (q - 32), m = 0..3, l = 0..31, where the 6-bit q is
        m = 0: lo[l] & 15      | (hi[l] & 3) << 4        m = 1: lo[32 + l] & 15 | (hi[l] >> 2 & 3) << 4
        m = 2: lo[l] >> 4      | (hi[l] >> 4 & 3) << 4   m = 3: lo[32 + l] >> 4 | (hi[l] >> 6) << 4."""
    if not (_is_c_array(u8, types.uint8) and _is_c_array(sc, types.float32) and _is_c_array(w, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        tu, _, _, ts, _, tw, _ = sig.args
        u, lo, hi, sc, k, w, j = args
        c = lambda v: _const(I8, 32, v)  # noqa: E731
        a, b = _load(context, builder, tu, u, lo, 32), _load(context, builder, tu, u, _add(builder, lo, 32), 32)
        h = _load(context, builder, tu, u, hi, 32)
        codes = [builder.or_(builder.and_(a, c(15)), builder.shl(builder.and_(h, c(3)), c(4))),
                 builder.or_(builder.and_(b, c(15)), builder.shl(builder.and_(builder.lshr(h, c(2)), c(3)), c(4))),
                 builder.or_(builder.lshr(a, c(4)), builder.shl(builder.and_(builder.lshr(h, c(4)), c(3)), c(4))),
                 builder.or_(builder.lshr(b, c(4)), builder.shl(builder.lshr(h, c(6)), c(4)))]
        scales = _load(context, builder, ts, sc, k, 8)
        for m, q in enumerate(codes):
            f = builder.sitofp(builder.sub(q, c(32)), _vec(F32, 32))
            s = _shuffle(builder, scales, [2 * m] * 16 + [2 * m + 1] * 16)
            _store(context, builder, tw, w, _add(builder, j, 32 * m), builder.fmul(s, f))
        return _void(context)

    return types.void(u8, lo, hi, sc, k, w, j), codegen


# ---------------------------------------------------------------------------------------------
# Integer dot products for K-quant weights times Q8_K activations (tinyspec/quants/q8_k.py).
#
# A super-block of 256 weights is unpacked once, into vector values that every input row reuses
# (q4_k_block, q5_k_block, q6_k_block: the row loop runs inside the intrinsic, so they stay in registers):
#     codes   256 unsigned codes q in value order (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63)
#     scl     a scale table: per value pair (2p, 2p + 1) the sc of its group (VNNI: see below)
#     mins    per 16 values, what multiplies the activation sum bsum (Q4_K/Q5_K: m of the group;
#             Q6_K: sc, because its codes carry an offset of 32)
# and for input row t the block contributes, with dx its Q8_K scale, qx its codes, bs its bsums,
#     f * sum_p scl[p] * (codes[2p] qx[2p] + codes[2p+1] qx[2p+1])  +  sum_j (g * mins[j]) * (-(dx * bs[j]))
# where f = d * dx and g = dmin (Q4_K, Q5_K) or 32 * d (Q6_K). The first sum is an exact integer
# (|pair| <= 2 * 63 * 127, a 16-lane i32 partial stays below 2^24 so its float conversion is exact too);
# g * mins[j] is exact too (an fp16 times a small integer, formed once per block), and -(dx * bs[j]) is
# formed once per row of x (the kernel's xb): the float part is two fmas per lane per block and the fixed
# 16-lane tree at the end of a row. (An integer mins . bsums per row and block would cost each row a load,
# a widening, a vpmulld and a convert more: docs/performance-log.md old 30 times both.) The *_block2
# forms (rows=2) take the same block of two weight rows: each input row's codes are loaded once for both,
# and the two rows' lanes are two independent chains of fmas through acc (one row's chain, load -> fma ->
# fma -> store a block, was what a verify pass waited on: LESSONS 7). Each row gets exactly its one-row bits.
#
# On CPUs with AVX-512BW the pair products are vpmaddubsw (u8 x i8 -> i16 pair sums, which cannot
# saturate at these ranges) and vpmaddwd (i16 x i16 -> i32 pair sums): 2 instructions per 64 weights
# per input row, against 4 float fmas plus the float decode. Elsewhere the same sums are written as plain
# vector IR (widen, multiply, add the pairs); the results are the same integers, bit for bit.
#
# With AVX512-VNNI (VNNI_LAYOUT) scl holds 64 scales, one per 4-value group, in the order VNNI_GROUPS:
# vpdpbusd sums 4 products per i32 lane (|sum| <= 4 * 63 * 127 < 2^15), vpackssdw packs two such vectors
# to i16 exactly, and vpmaddwd / vpdpwssd apply the scales: 6 multiplies per 256 weights per row instead
# of 8. Other integers land in each of the 16 lanes than in the pair layout, so the float results differ
# between the two layouts (both within the oracle's bound, each batch-invariant); on one CPU the layout
# never changes. Q6_K with VNNI goes further (q6_k_signed_block, below).

def _host_has(*features) -> bool:
    try:
        from llvmlite import binding

        host = binding.get_host_cpu_features()
        return all(host.get(f, False) for f in features)
    except Exception:  # an unknown host: the portable IR
        return False


# TINYSPEC_SIMD=portable: plain vector IR only; =no-vnni: AVX-512BW without VNNI (to test the fallbacks here)
FORCE = os.environ.get("TINYSPEC_SIMD", "")
NATIVE_MADD = _host_has("avx512bw") and FORCE != "portable"
NATIVE_VNNI = NATIVE_MADD and _host_has("avx512vnni") and FORCE != "no-vnni"  # vpdpbusd, vpdpwssd
VNNI_LAYOUT = NATIVE_VNNI  # the scale-table layout the *_block intrinsics use on this CPU


def _pairs(builder, v, n):  # <2n x T> -> (even lanes, odd lanes) as two <n x T>
    return _shuffle(builder, v, range(0, 2 * n, 2)), _shuffle(builder, v, range(1, 2 * n, 2))


def _madd_u8i8(builder, a, b, native):  # <64 x u8>, <64 x i8> -> <32 x i16>: a[2p] b[2p] + a[2p+1] b[2p+1]
    if native:
        fnty = ir.FunctionType(_vec(I16, 32), [_vec(I8, 64)] * 2)
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.pmaddubs.w.512"),
                            [a, b])
    p = builder.mul(builder.zext(a, _vec(I16, 64)), builder.sext(b, _vec(I16, 64)))
    return builder.add(*_pairs(builder, p, 32))


def _madd_i16(builder, a, b, native):  # <32 x i16> x2 -> <16 x i32>: a[2p] b[2p] + a[2p+1] b[2p+1]
    if native:
        fnty = ir.FunctionType(_vec(I32, 16), [_vec(I16, 32)] * 2)
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.pmaddw.d.512"),
                            [a, b])
    p = builder.mul(builder.sext(a, _vec(I32, 32)), builder.sext(b, _vec(I32, 32)))
    return builder.add(*_pairs(builder, p, 16))


def _x86(builder, name, ret, args):  # call an x86 intrinsic; vectors bitcast to the declared types
    fnty = ir.FunctionType(ret, [t for t, _ in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name),
                        [builder.bitcast(v, t) for t, v in args])


def _dot4_u8i8(builder, a, b, native, acc=None):  # <64 x u8>, <64 x i8> -> <16 x i32>: [acc +] sums of 4 adjacent products
    v16 = _vec(I32, 16)
    if native:  # vpdpbusd onto acc or zero (LLVM's original i32 operand types; newer LLVMs upgrade them)
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.512", v16,
                    [(v16, ir.Constant(v16, None) if acc is None else acc), (v16, a), (v16, b)])
    p = builder.mul(builder.zext(a, _vec(I32, 64)), builder.sext(b, _vec(I32, 64)))
    q = [_shuffle(builder, p, range(j, 64, 4)) for j in range(4)]
    s = builder.add(builder.add(q[0], q[1]), builder.add(q[2], q[3]))
    return s if acc is None else builder.add(acc, s)


PACK_ORDER = tuple(j + 4 * c + 16 * h for c in range(4) for h in range(2) for j in range(4))  # vpackssdw's lanes


def _pack_i32(builder, a, b, native):  # <16 x i32> x2 (each |v| < 2^15) -> <32 x i16> in PACK_ORDER
    if native:
        return _x86(builder, "llvm.x86.avx512.packssdw.512", _vec(I16, 32), [(_vec(I32, 16), a), (_vec(I32, 16), b)])
    return builder.trunc(_shuffle(builder, _cat(builder, a, b), PACK_ORDER), _vec(I16, 32))


def _madd_acc_i16(builder, acc, a, b, native):  # acc + _madd_i16(a, b): one vpdpwssd
    if native:
        v16 = _vec(I32, 16)
        return _x86(builder, "llvm.x86.avx512.vpdpwssd.512", v16, [(v16, acc), (v16, a), (v16, b)])
    return builder.add(acc, _madd_i16(builder, a, b, False))


# The VNNI layout of a scale table: slot s holds the scale of the 4-value group VNNI_GROUPS[s]. The dot
# takes 4-value sums of the 256 products (vpdpbusd: lane l of vector v = values 64v + 4l .. + 3), packs
# vectors (0, 1) and (2, 3) to i16 (vpackssdw interleaves 128-bit quarters: PACK_ORDER), and multiplies
# each adjacent pair of packed sums by one scale (vpmaddwd): 6 multiplies for 256 values, not 8.
VNNI_GROUPS = tuple(16 * (2 * w + PACK_ORDER[m] // 16) + PACK_ORDER[m] % 16 for w in range(2) for m in range(32))


def _q6_k_codes(context, builder, tu, u, i):  # the Q6_K block at u8[i] -> its 256 codes q + 32 (0..63), 2 x <128 x i8>
    c = lambda v: _const(I8, 32, v)  # noqa: E731
    halves = []
    for h in range(2):
        a = _load(context, builder, tu, u, _add(builder, i, 64 * h), 32)
        b = _load(context, builder, tu, u, _add(builder, i, 64 * h + 32), 32)
        q = _load(context, builder, tu, u, _add(builder, i, 128 + 32 * h), 32)
        m0 = builder.or_(builder.and_(a, c(15)), builder.shl(builder.and_(q, c(3)), c(4)))
        m1 = builder.or_(builder.and_(b, c(15)), builder.shl(builder.and_(builder.lshr(q, c(2)), c(3)), c(4)))
        m2 = builder.or_(builder.lshr(a, c(4)), builder.shl(builder.and_(builder.lshr(q, c(4)), c(3)), c(4)))
        m3 = builder.or_(builder.lshr(b, c(4)), builder.shl(builder.lshr(q, c(6)), c(4)))
        halves.append(_cat(builder, _cat(builder, m0, m1), _cat(builder, m2, m3)))
    return halves


def _q4_k_codes(context, builder, tu, u, i):  # Q4_K: value 64c + l = low nibble of qs[32c + l], + 32: the high one
    out = []
    for k in range(4):
        b = _load(context, builder, tu, u, _add(builder, i, 16 + 32 * k), 32)
        out.append(_cat(builder, builder.and_(b, _const(I8, 32, 15)), builder.lshr(b, _const(I8, 32, 4))))
    return out


# Q4_K on VNNI reads its codes 64 bytes at a time: the low nibbles of qs[64h:64h+64] are values
# 128h + [0..31, 64..95], the high ones 128h + [32..63, 96..127] (one and, one shift per 64 codes, no
# shuffle to put them in value order). The dot needs x in the same order, so the kernel lays each 128
# values of a Q8_K row out as Q4_K_WIDE_X (once per call), and the 4-value groups land in other lanes of the
# packed sums: the table follows them (VNNI_GROUPS_WIDE), and the 16 integer lanes come out as the value
# layout's lanes in the order LANE_SWAP (an involution). So the offsets xb are laid out in that order, and
# the row's final tree reads its lanes back through it (lane_sum16_swapped): the same integers meet the same
# floats in the same order, the results are bit for bit those of the value-order kernel.
Q4_K_WIDE_X = tuple(range(0, 32)) + tuple(range(64, 96)) + tuple(range(32, 64)) + tuple(range(96, 128))


def _wide_group(v: int, lane: int) -> int:  # the 4-value group (value // 4) in lane `lane` of wide vector v
    return 32 * (v // 2) + 8 * (v % 2) + (lane if lane < 8 else 16 + lane - 8)


def _lane_groups(group) -> list[frozenset]:  # per i32 lane of the VNNI isum: the 4-value groups summed there
    return [frozenset(group(2 * w + PACK_ORDER[m] // 16, PACK_ORDER[m] % 16)
                      for w in range(2) for m in (2 * p, 2 * p + 1)) for p in range(16)]


VNNI_GROUPS_WIDE = tuple(_wide_group(2 * w + PACK_ORDER[m] // 16, PACK_ORDER[m] % 16)
                         for w in range(2) for m in range(32))
LANE_SWAP = tuple(_lane_groups(lambda v, lane: 16 * v + lane).index(g) for g in _lane_groups(_wide_group))
assert sorted(LANE_SWAP) == list(range(16)) and all(LANE_SWAP[LANE_SWAP[n]] == n for n in range(16))


def _q4_k_codes_wide(context, builder, tu, u, i):  # Q4_K's codes as 4 x <64 x i8>, vector v = values of _wide_group
    out = []
    for h in range(2):
        b = _load(context, builder, tu, u, _add(builder, i, 16 + 64 * h), 64)
        out += [builder.and_(b, _const(I8, 64, 15)), builder.lshr(b, _const(I8, 64, 4))]
    return out


def _q5_k_codes(context, builder, tu, u, i):  # Q5_K: as Q4_K (qs at 48), plus bit 16 of value 32j + l from bit j of qh[l]
    h = _load(context, builder, tu, u, _add(builder, i, 16), 32)
    one, four = _const(I8, 32, 1), _const(I8, 32, 4)
    out = []
    for k in range(4):
        b = _load(context, builder, tu, u, _add(builder, i, 48 + 32 * k), 32)
        hi0 = builder.shl(builder.and_(builder.lshr(h, _const(I8, 32, 2 * k)), one), four)
        hi1 = builder.shl(builder.and_(builder.lshr(h, _const(I8, 32, 2 * k + 1)), one), four)
        out.append(_cat(builder, builder.or_(builder.and_(b, _const(I8, 32, 15)), hi0),
                        builder.or_(builder.lshr(b, four), hi1)))
    return out


def _crumb_codes(context, builder, tu, u, i, hmask=None):
    # Q2_K / Q3_K: value 128c + 32s + l = bits 2s, 2s+1 of qs[32c + l] (qs at u8[i]); with hmask (Q3_K) + 4 when
    # bit 4c + s of hmask[l] is set (codes 0..7 = q + 4) -> 4 x <64 x i8> in value order
    parts = []
    for c in range(2):
        qs = _load(context, builder, tu, u, _add(builder, i, 32 * c), 32)
        for sh in range(4):
            q = builder.and_(builder.lshr(qs, _const(I8, 32, 2 * sh)), _const(I8, 32, 3))
            if hmask is not None:
                bit = builder.and_(builder.lshr(hmask, _const(I8, 32, 4 * c + sh)), _const(I8, 32, 1))
                q = builder.or_(q, builder.shl(bit, _const(I8, 32, 2)))
            parts.append(q)
    return [_cat(builder, parts[2 * v], parts[2 * v + 1]) for v in range(4)]


def _q2_k_codes(context, builder, tu, u, i):  # Q2_K: 2-bit codes 0..3 (qs at byte 16)
    return _crumb_codes(context, builder, tu, u, _add(builder, i, 16))


def _q3_k_codes(context, builder, tu, u, i):  # Q3_K: q + 4 in 0..7 (hmask at byte 0, qs at 32)
    return _crumb_codes(context, builder, tu, u, _add(builder, i, 32), _load(context, builder, tu, u, i, 32))


def _q3_k_scales(builder, b):  # the 12 scale bytes <12 x i8> -> the 16 signed scales sc - 32 as <16 x i16>
    shifts_low = ir.Constant(_vec(I8, 16), [0] * 8 + [4] * 8)  # scale i: nibble i // 8 of byte i % 8
    shifts_high = ir.Constant(_vec(I8, 16), [0] * 4 + [2] * 4 + [4] * 4 + [6] * 4)  # bits 2(i // 4) of byte 8 + i % 4
    low = builder.and_(builder.lshr(_shuffle(builder, b, list(range(8)) * 2), shifts_low), _const(I8, 16, 15))
    high = builder.and_(builder.lshr(_shuffle(builder, b, [8, 9, 10, 11] * 4), shifts_high), _const(I8, 16, 3))
    return builder.sub(builder.zext(builder.or_(low, builder.shl(high, _const(I8, 16, 4))), _vec(I16, 16)),
                       _const(I16, 16, 32))


def _q6_k_codes4(context, builder, tu, u, i):  # Q6_K: its codes q + 32 (0..63) as 4 x <64 x i8>
    return [_shuffle(builder, half, range(64 * n, 64 * n + 64)) for half in _q6_k_codes(context, builder, tu, u, i)
            for n in range(2)]


def _scale_tables(builder, sc16, vnni, groups=VNNI_GROUPS):  # <n x i16>, one scale per 256 / n values -> the table
    n = sc16.type.count                                           # as <32 x i16> parts
    order = [g * n // 64 for g in groups] if vnni else [p * n // 128 for p in range(128)]
    table = _shuffle(builder, sc16, order)
    return [_shuffle(builder, table, range(32 * c, 32 * c + 32)) for c in range(len(order) // 32)]


def _k_block(kind: str, native: bool, vnni: bool, wide: bool | None = None, rows: int = 1):
    if wide is None:  # Q4_K on VNNI: codes 64 bytes at a time, x in Q4_K_WIDE_X order, lanes in LANE_SWAP order
        wide = kind == "q4_k" and vnni
    if wide and not (kind == "q4_k" and vnni):
        raise ValueError("the wide layout is Q4_K's on VNNI")
    codes_of = {"q2_k": _q2_k_codes, "q3_k": _q3_k_codes, "q4_k": _q4_k_codes_wide if wide else _q4_k_codes,
                "q5_k": _q5_k_codes, "q6_k": _q6_k_codes4}[kind]

    def unpack(context, builder, tu, u, o):  # the block at u8[o] -> codes, scale tables, dmin m lanes, d
        half = lambda at: _half(context, builder, tu, u, _add(builder, o, at))  # noqa: E731
        codes = codes_of(context, builder, tu, u, o)
        if kind == "q6_k":  # 16 int8 scales; the codes' offset 32 is taken back as 32 d * (scales . bsums)
            d = half(208)
            dmin = builder.fmul(ir.Constant(F32, 32.0), d)  # exact
            sc16 = builder.sext(_load(context, builder, tu, u, _add(builder, o, 192), 16), _vec(I16, 16))
            mins16 = sc16
        elif kind == "q3_k":  # 16 scales sc - 32; the codes' offset 4 is taken back as 4 d * (scales . bsums)
            d = half(108)
            dmin = builder.fmul(ir.Constant(F32, 4.0), d)  # exact
            sc16 = _q3_k_scales(builder, _load(context, builder, tu, u, _add(builder, o, 96), 12))
            mins16 = sc16
        elif kind == "q2_k":  # 16 bytes: scale (low nibble) and min (high nibble) of each 16 values
            d, dmin = half(80), half(82)
            scales = _load(context, builder, tu, u, o, 16)
            sc16 = builder.zext(builder.and_(scales, _const(I8, 16, 15)), _vec(I16, 16))
            mins16 = builder.zext(builder.lshr(scales, _const(I8, 16, 4)), _vec(I16, 16))
        else:  # Q4_K / Q5_K: eight 6-bit (sc, m) pairs, one per 32 values
            d, dmin = half(0), half(2)
            sc, m = _k_scale_codes(builder, _load(context, builder, tu, u, _add(builder, o, 4), 12))
            sc16 = builder.zext(sc, _vec(I16, 8))
            lanes = LANE_SWAP if wide else range(16)  # lane n holds group-of-16 lanes[n]
            mins16 = _shuffle(builder, builder.zext(m, _vec(I16, 8)), [jj // 2 for jj in lanes])
        tables = _scale_tables(builder, sc16, vnni, VNNI_GROUPS_WIDE if wide else VNNI_GROUPS)
        mins = builder.fmul(_splat(builder, dmin, 16), builder.sitofp(mins16, _vec(F32, 16)))  # dmin m, exact
        return codes, tables, mins, d

    def body(context, builder, sig, args, blocks):  # every input row t through the unpacked blocks
        tu, tq, tb, tx, ta = sig.args[0], sig.args[rows + 1], sig.args[rows + 4], sig.args[rows + 5], sig.args[rows + 8]
        u, q, k, n_in, b, x, j, nb, a, T = (args[0],) + tuple(args[rows + 1:])
        with cgutils.for_range(builder, T) as loop:
            t = loop.index
            kk = builder.add(k, builder.mul(t, n_in))
            qxs = [_load(context, builder, tq, q, _add(builder, kk, 64 * v), 64) for v in range(4)]
            e = builder.load(_ptr(context, builder, tx, x, builder.add(j, builder.mul(t, nb))))
            xb = _load(context, builder, tb, b, builder.ashr(kk, ir.Constant(I64, 4)), 16)
            for n, (codes, tables, mins, d) in enumerate(blocks):
                isum = _k_isum(builder, codes, qxs, tables, vnni, native)
                i = _add(builder, builder.mul(t, ir.Constant(I64, 16 * rows)), 16 * n)
                r = _fma(builder, builder.sitofp(isum, _vec(F32, 16)), _splat(builder, builder.fmul(d, e), 16),
                         _load(context, builder, ta, a, i, 16))
                _store(context, builder, ta, a, i, _fma(builder, mins, xb, r))
        return _void(context)

    if rows == 1:
        @intrinsic
        def k_block(typingctx, u8, o, qx, k, n_in, bs, dx, j, nb, acc, T):
            if not (_is_c_array(u8, types.uint8) and _is_c_array(qx, types.int8) and _is_c_array(bs, types.float32)
                    and _is_c_array(dx, types.float32) and _is_c_array(acc, types.float32)):
                return None

            def codegen(context, builder, sig, args):
                return body(context, builder, sig, args, [unpack(context, builder, sig.args[0], args[0], args[1])])

            return types.void(u8, o, qx, k, n_in, bs, dx, j, nb, acc, T), codegen
    else:
        @intrinsic
        def k_block(typingctx, u8, o, o2, qx, k, n_in, bs, dx, j, nb, acc, T):
            if not (_is_c_array(u8, types.uint8) and _is_c_array(qx, types.int8) and _is_c_array(bs, types.float32)
                    and _is_c_array(dx, types.float32) and _is_c_array(acc, types.float32)):
                return None

            def codegen(context, builder, sig, args):
                blocks = [unpack(context, builder, sig.args[0], args[0], at) for at in (args[1], args[2])]
                return body(context, builder, sig, args, blocks)

            return types.void(u8, o, o2, qx, k, n_in, bs, dx, j, nb, acc, T), codegen

    k_block.__doc__ = f"""The {kind.upper()} block at u8[o] times input rows t = 0 .. T-1 (Q8_K codes qx[k + t n_in:][:256],
    scale dx[j + t nb], the 16 group terms xb[(k + t n_in) / 16:][:16] = -(dx * bsum) of q8_k_offsets) into
    acc[16t:16t+16]:
        acc += (d dx) * isum + (dmin m) * xb         two fmas per lane: an exact integer sum, the offsets
    with the codes, scale tables and dmin m (exact: an fp16 times a 6-bit integer) unpacked once into
    registers for every row (see the section comment). rows = 2: also the block at u8[o2] (the same
    columns of the next weight row) into acc[32t+16:32t+32], each input row's codes loaded once for both."""
    return k_block


def _k_isum(builder, codes, qxs, tables, vnni, native):  # the exact lane sums of one input row
    if vnni:  # 4-value sums, packed to i16, times the 64 group scales
        d4 = [_dot4_u8i8(builder, codes[v], qxs[v], native) for v in range(4)]
        isum = _madd_i16(builder, _pack_i32(builder, d4[0], d4[1], native), tables[0], native)
        return _madd_acc_i16(builder, isum, _pack_i32(builder, d4[2], d4[3], native), tables[1], native)
    isum = None  # pair sums times the 128 pair scales
    for v in range(4):
        part = _madd_i16(builder, _madd_u8i8(builder, codes[v], qxs[v], native), tables[v], native)
        isum = part if isum is None else builder.add(isum, part)
    return isum


# Q6_K on VNNI without the offset term. Its codes carry +32 so that vpdpbusd's unsigned operand can hold
# them, which costs every input row the mins x bsums correction (an fma and a load a block). Swap the roles:
# the codes become signed (q, -32..31) and the activations unsigned (x' = qx + 128, 1..255, once per call),
#     sum sc * q * qx  =  sum sc * q * x'  -  128 * sum sc * q
# where the last term belongs to the weight block alone: q6_k_signed_block computes it once, in the lanes
# the dot produces, as `base` (its negation), and every row starts its vpdpwssd chain from it. Every 4-value
# sum stays in i16 (|x' q| sums <= 4 * 255 * 32 = 32640), the lane sums are the exact integers of the pair
# layout's isum - 32 * corr, and one fma per lane replaces two.

def _vnni_lanes(builder, d4, s0, s1, acc, native):  # 4 x <16 x i32> 4-value sums -> acc + the scaled lane sums
    isum = _madd_acc_i16(builder, acc, _pack_i32(builder, d4[0], d4[1], native), s0, native)
    return _madd_acc_i16(builder, isum, _pack_i32(builder, d4[2], d4[3], native), s1, native)


def _q6_k_signed_tables(context, builder, tu, u, i, native):
    """The Q6_K block at u8[i] -> (codes: 4 x <64 x i8> signed q, the two <32 x i16> halves of the VNNI
    scale table, base <16 x i32> = -128 * the lane sums of scale * q), all as values."""
    codes = []
    for half in _q6_k_codes(context, builder, tu, u, i):
        half = builder.sub(half, _const(I8, 128, 32))
        codes += [_shuffle(builder, half, range(0, 64)), _shuffle(builder, half, range(64, 128))]
    sc = builder.sext(_load(context, builder, tu, u, _add(builder, i, 192), 16), _vec(I16, 16))
    s0, s1 = _scale_tables(builder, sc, True)
    eights = _const(I8, 64, 128)  # x' = 128 everywhere: the offset's share of every lane
    zero = ir.Constant(_vec(I32, 16), None)
    lanes = _vnni_lanes(builder, [_dot4_u8i8(builder, eights, v, native) for v in codes], s0, s1, zero, native)
    return codes, s0, s1, builder.sub(zero, lanes)


def _q6_k_signed_lanes(context, builder, tq, q, k, codes, s0, s1, base, native):  # one input row's exact lane sums
    d4 = [_dot4_u8i8(builder, _load(context, builder, tq, q, _add(builder, k, 64 * v), 64), codes[v], native)
          for v in range(4)]
    return _vnni_lanes(builder, d4, s0, s1, base, native)


def _unsigned_x_intrinsic(body, rows: int):
    """The intrinsic of a block kind whose rows take x' = qx + 128 (Q6_K signed, IQ4_XS): (u8, o, [o2,] qxu, k,
    n_in, dx, j, nb, acc, T), its codegen body(context, builder, sig, args, block offsets)."""
    def ok(u8, qxu, dx, acc):
        return (_is_c_array(u8, types.uint8) and _is_c_array(qxu, types.uint8) and _is_c_array(dx, types.float32)
                and _is_c_array(acc, types.float32))

    if rows == 1:
        @intrinsic
        def block(typingctx, u8, o, qxu, k, n_in, dx, j, nb, acc, T):
            if not ok(u8, qxu, dx, acc):
                return None
            return (types.void(u8, o, qxu, k, n_in, dx, j, nb, acc, T),
                    lambda context, builder, sig, args: body(context, builder, sig, args, [args[1]]))
    else:
        @intrinsic
        def block(typingctx, u8, o, o2, qxu, k, n_in, dx, j, nb, acc, T):
            if not ok(u8, qxu, dx, acc):
                return None
            return (types.void(u8, o, o2, qxu, k, n_in, dx, j, nb, acc, T),
                    lambda context, builder, sig, args: body(context, builder, sig, args, [args[1], args[2]]))
    return block


def _q6_k_signed_block(native: bool, rows: int = 1):
    def body(context, builder, sig, args, offsets):
        tu, tq, tx, ta = sig.args[0], sig.args[rows + 1], sig.args[rows + 4], sig.args[rows + 7]
        u, q, k, n_in, x, j, nb, a, T = (args[0],) + tuple(args[rows + 1:])
        blocks = [_q6_k_signed_tables(context, builder, tu, u, o, native) + (_half(context, builder, tu, u,
                                                                                    _add(builder, o, 208)),)
                  for o in offsets]
        with cgutils.for_range(builder, T) as loop:
            t = loop.index
            kk = builder.add(k, builder.mul(t, n_in))
            xs = [_load(context, builder, tq, q, _add(builder, kk, 64 * v), 64) for v in range(4)]
            e = builder.load(_ptr(context, builder, tx, x, builder.add(j, builder.mul(t, nb))))
            for n, (codes, s0, s1, base, d) in enumerate(blocks):
                isum = _vnni_lanes(builder, [_dot4_u8i8(builder, xs[v], codes[v], native) for v in range(4)], s0, s1,
                                   base, native)
                i = _add(builder, builder.mul(t, ir.Constant(I64, 16 * rows)), 16 * n)
                r = _fma(builder, builder.sitofp(isum, _vec(F32, 16)), _splat(builder, builder.fmul(d, e), 16),
                         _load(context, builder, ta, a, i, 16))
                _store(context, builder, ta, a, i, r)
        return _void(context)

    q6_k_signed_block = _unsigned_x_intrinsic(body, rows)
    q6_k_signed_block.__doc__ = """The Q6_K block at u8[o] times input rows t = 0 .. T-1 of x' = qx + 128
        (qxu[k + t n_in:][:256]):
        acc[16t:16t+16] += d * dx[j + t nb] * lanes, lanes = base + the scaled 4-value sums of x' * q. The
        codes, scales and base stay in registers for every row (through memory, a store to acc may alias
        them, so every row would reload them). rows = 2: also the block at u8[o2] into acc[32t+16:32t+32],
        each input row's x' loaded once for both."""
    return q6_k_signed_block


# Q8_0 weights times activations rounded to Q8_0 (per 32 values, fp16 scale: llama.cpp's vec_dot_type for
# Q8_0, and for Q4_0, Q5_0 and IQ4_NL, whose codes become the signed weights q - 8, q - 16 and
# KVALUES_IQ4[q]). Both codes are signed; vpdpbusd wants one operand unsigned, so the activations come as
# x' = q_x + 128 (0..255) and
#     sum q_w q_x  =  sum q_w x'  -  128 sum q_w
# where the last term belongs to the weight block alone: computed once per block pair as `base` (its
# negation, in the lanes the dot produces), it is the accumulator every input row's vpdpbusd starts from,
# so one instruction gives a row its exact 4-value sums (|sum| <= 4 * 255 * 128 < 2^31).

def _legacy_codes(context, builder, tu, u, i, kind, native):  # one 32-value block's codes (signed) as <32 x i8>
    if kind == "q8_0":  # d, qs[32] int8
        return _load(context, builder, tu, u, _add(builder, i, 2), 32)
    qs = 6 if kind == "q5_0" else 2  # d, [qh (u32),] qs[16]: value l low nibble, l + 16 high
    b = _load(context, builder, tu, u, _add(builder, i, qs), 16)
    c = _cat(builder, builder.and_(b, _const(I8, 16, 15)), builder.lshr(b, _const(I8, 16, 4)))
    if kind == "q4_0":  # q - 8
        return builder.sub(c, _const(I8, 32, 8))
    if kind == "q5_0":  # q | (bit l of qh) << 4, then - 16
        qh_ptr = builder.bitcast(_ptr(context, builder, tu, u, _add(builder, i, 2)), I32.as_pointer())
        qh = builder.load(qh_ptr, align=1)
        bit = builder.and_(builder.lshr(_splat(builder, qh, 32), ir.Constant(_vec(I32, 32), list(range(32)))),
                           _const(I32, 32, 1))
        return builder.sub(builder.or_(c, builder.shl(builder.trunc(bit, _vec(I8, 32)), _const(I8, 32, 4))),
                           _const(I8, 32, 16))
    return _shuffle(builder, _iq4_lookup(builder, _cat(builder, c, c), native), range(32))  # iq4_nl: KVALUES_IQ4[c]


_LEGACY_BYTES = {"q8_0": 34, "q4_0": 18, "iq4_nl": 18, "q5_0": 22}  # bytes a 32-value block


def _q8_0_weights(context, builder, tu, u, o, kind: str, native: bool, blocks: int):
    """The weight side of one pair of blocks at u8[o] (or a lone last block: blocks = 1, the second half zero
    weights, which add 0 to every lane): its 64 signed codes, base = -128 * (4-value sums of the codes) and the
    block scales dw (lanes 0-7: block 0's, 8-15: block 1's)."""
    size = _LEGACY_BYTES[kind]
    d0 = _half(context, builder, tu, u, o)
    codes = _legacy_codes(context, builder, tu, u, o, kind, native)
    if blocks == 2:
        d1 = _half(context, builder, tu, u, _add(builder, o, size))
        codes = _cat(builder, codes, _legacy_codes(context, builder, tu, u, _add(builder, o, size), kind, native))
    else:
        d1 = ir.Constant(F32, 0.0)
        codes = _cat(builder, codes, ir.Constant(_vec(I8, 32), None))
    base = builder.sub(ir.Constant(_vec(I32, 16), None), _dot4_u8i8(builder, _const(I8, 64, 128), codes, native))
    dw = _shuffle(builder, _cat(builder, _splat(builder, d0, 1), _splat(builder, d1, 1)), [0] * 8 + [1] * 8)
    return codes, base, dw


def _q8_0_x(context, builder, tq, q, k, tx, x, j):
    """One input row's side of a pair: x' = q_x + 128 at qxu[k:k+64], its block scales as 16 lanes at dxb[8j:8j+16]
    (numba_ops._quantize_q8_0 writes each block's scale 8 times, so the lanes are one load, not a load and a
    shuffle per weight row: 10-15% of a Q8_0 matmul's time per input row)."""
    return _load(context, builder, tq, q, k, 64), _load(context, builder, tx, x, builder.mul(j, ir.Constant(j.type, 8)), 16)


def _q8_0_fma(builder, weights, xs, dx, acc, native: bool):
    """acc + (d_w * d_x) * (base + sum of x' w over each lane's 4 values): a pair's weights (_q8_0_weights) against
    an input row's (_q8_0_x)."""
    codes, base, dw = weights
    isum = _dot4_u8i8(builder, xs, codes, native, base)
    return _fma(builder, builder.sitofp(isum, _vec(F32, 16)), builder.fmul(dw, dx), acc)


def _q8_0_step(context, builder, weights, tq, q, k, tx, x, j, acc, native: bool):
    """_q8_0_fma of the input row at qxu[k:], dxb[j:]."""
    xs, dx = _q8_0_x(context, builder, tq, q, k, tx, x, j)
    return _q8_0_fma(builder, weights, xs, dx, acc, native)


def _q8_0_pair(native: bool, blocks: int, kind: str = "q8_0"):
    @intrinsic
    def q8_0_pair(typingctx, u8, o, qxu, k, W, dxb, j, nb2, acc, T):
        if not (_is_c_array(u8, types.uint8) and _is_c_array(qxu, types.uint8) and _is_c_array(dxb, types.float32)
                and _is_c_array(acc, types.float32)):
            return None

        def codegen(context, builder, sig, args):
            tu, _, tq, _, _, tx, _, _, ta, _ = sig.args
            u, o, q, k, W, x, j, nb2, a, T = args
            weights = _q8_0_weights(context, builder, tu, u, o, kind, native, blocks)
            with cgutils.for_range(builder, T) as loop:
                t = loop.index
                i = builder.mul(t, ir.Constant(I64, 16))
                r = _q8_0_step(context, builder, weights, tq, q, builder.add(k, builder.mul(t, W)), tx, x,
                               builder.add(j, builder.mul(t, nb2)), _load(context, builder, ta, a, i, 16), native)
                _store(context, builder, ta, a, i, r)
            return _void(context)

        return types.void(u8, o, qxu, k, W, dxb, j, nb2, acc, T), codegen

    q8_0_pair.__doc__ = f"""{blocks} {kind.upper()} block(s) at u8[o] times input rows t = 0 .. T-1 (x' = q_x + 128 at
    qxu[k + t W:][:64], block scales dxb[8 (j + t nb2):][:16], each block's 8 times) into acc[16t:16t+16]:
        acc[l] += (d_w * d_x) * (base[l] + sum of x' w over values 4l .. 4l+3)       lanes 0-7: block 0
    with the codes w (Q8_0: q; Q4_0: q - 8; Q5_0: q - 16; IQ4_NL: KVALUES_IQ4[q]), base and weight scales in registers
    for every row."""
    return q8_0_pair


def _q8_0_rows(native: bool, kind: str = "q8_0", rows: int = 1, inputs: int = 1):
    size = _LEGACY_BYTES[kind]

    @intrinsic
    def q8_0_rows(typingctx, u8, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, ahead, y, i, n_out):
        if not (_is_c_array(u8, types.uint8) and _is_c_array(qxu, types.uint8) and _is_c_array(dxb, types.float32)
                and _is_c_array(y, types.float32)):
            return None

        def codegen(context, builder, sig, args):
            tu, tq, tx, ty = sig.args[0], sig.args[4], sig.args[7], sig.args[11]
            u, o, row_bytes, nbk, q, k0, W, x, j0, nb2, ahead, yv, i, n_out = args
            c = lambda n: ir.Constant(I64, n)  # noqa: E731
            starts = [builder.add(o, builder.mul(row_bytes, c(r))) for r in range(rows)]
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_vec(F32, 16), None)) for _ in range(inputs)]
                    for _ in range(rows)]  # registers after mem2reg: rows x inputs vectors of 16 lanes
            full = builder.sdiv(nbk, c(2))

            def step(p, blocks):  # pair p (or the lone last block) of every weight row against every input row
                xs = [_q8_0_x(context, builder, tq, q, builder.add(builder.add(k0, builder.mul(W, c(t))),
                                                                  builder.mul(p, c(64))),
                              tx, x, builder.add(builder.add(j0, builder.mul(nb2, c(t))), builder.mul(p, c(2))))
                      for t in range(inputs)]
                for start, row_accs in zip(starts, accs):
                    ob = builder.add(start, builder.mul(p, c(2 * size)))
                    if blocks == 2:
                        _prefetch(context, builder, tu, u, builder.add(ob, ahead))
                    weights = _q8_0_weights(context, builder, tu, u, ob, kind, native, blocks)
                    for (x_t, dx_t), acc in zip(xs, row_accs):
                        builder.store(_q8_0_fma(builder, weights, x_t, dx_t, builder.load(acc), native), acc)

            with cgutils.for_range(builder, full) as loop:
                step(loop.index, 2)
            with builder.if_then(builder.icmp_signed("!=", builder.srem(nbk, c(2)), c(0))):
                step(full, 1)
            for r, row_accs in enumerate(accs):
                for t, acc in enumerate(row_accs):
                    total = _tree_sum(builder, builder.load(acc))
                    at = builder.add(builder.add(i, c(r)), builder.mul(n_out, c(t)))
                    _store(context, builder, ty, yv, at,
                           builder.insert_element(ir.Constant(_vec(F32, 1), None), total, ir.Constant(I32, 0)))
            return _void(context)

        return types.void(u8, o, row_bytes, nbk, qxu, k0, W, dxb, j0, nb2, ahead, y, i, n_out), codegen

    q8_0_rows.__doc__ = f"""{rows} whole {kind.upper()} weight row(s) at u8[o + r row_bytes] (nbk blocks each) times {inputs}
    input row(s) t (x' at qxu[k0 + t W:], block scales at dxb[8 (j0 + t nb2):]) into y.flat[i + r + t n_out],
    prefetching u8[... + ahead]: the pair loop of q8_0_pair / q8_0_single with every (weight row, input row)'s 16
    lanes in a register instead of memory (each input row's codes loaded once for every weight row, each pair of
    weight blocks unpacked once for every input row), then lane_sum16's tree. The same operations in the same order
    per (row, input), so the same bits as the pair calls and lane_sum16 (tests/test_numba_ops.py checks it)."""
    return q8_0_rows


q8_0_pair, q8_0_single = _q8_0_pair(NATIVE_VNNI, 2), _q8_0_pair(NATIVE_VNNI, 1)
q4_0_pair, q4_0_single = _q8_0_pair(NATIVE_VNNI, 2, "q4_0"), _q8_0_pair(NATIVE_VNNI, 1, "q4_0")
iq4_nl_pair, iq4_nl_single = _q8_0_pair(NATIVE_VNNI, 2, "iq4_nl"), _q8_0_pair(NATIVE_VNNI, 1, "iq4_nl")
q5_0_pair, q5_0_single = _q8_0_pair(NATIVE_VNNI, 2, "q5_0"), _q8_0_pair(NATIVE_VNNI, 1, "q5_0")
# the kernels (numba_ops._quant_linear_q8_0_parallel): weight rows x input rows held in registers, any number of inputs
q8_0_rows2x1, q8_0_rows1x1, q8_0_rows1x2, q8_0_rows1x4 = (_q8_0_rows(NATIVE_VNNI, "q8_0", r, t)
                                                          for r, t in ((2, 1), (1, 1), (1, 2), (1, 4)))
q4_0_rows2x1, q4_0_rows1x1, q4_0_rows1x2, q4_0_rows1x4 = (_q8_0_rows(NATIVE_VNNI, "q4_0", r, t)
                                                          for r, t in ((2, 1), (1, 1), (1, 2), (1, 4)))
q5_0_rows2x1, q5_0_rows1x1, q5_0_rows1x2, q5_0_rows1x4 = (_q8_0_rows(NATIVE_VNNI, "q5_0", r, t)
                                                          for r, t in ((2, 1), (1, 1), (1, 2), (1, 4)))
iq4_nl_rows2x1, iq4_nl_rows1x1, iq4_nl_rows1x2, iq4_nl_rows1x4 = (_q8_0_rows(NATIVE_VNNI, "iq4_nl", r, t)
                                                                  for r, t in ((2, 1), (1, 1), (1, 2), (1, 4)))


@intrinsic
def f32_from_bits(typingctx, b):
    """The float32 whose IEEE bits are the low 32 bits of the integer b (a bitcast: no conversion)."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        return builder.bitcast(builder.trunc(v, I32) if v.type.width > 32 else v, F32)

    return types.float32(b), codegen


@intrinsic
def round_f16(typingctx, v):
    """The float32 v rounded to the nearest fp16 (ties to even; overflow to inf), as float32: a scale
    stored in an fp16 field (np.float32(np.float16(v)); Numba has no float16 on the CPU)."""
    if v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), F32)

    return types.float32(v), codegen


# IQ4_XS times Q8_K activations. Its codes index KVALUES_IQ4 (-127..113): signed 8-bit weights whose
# 4-value sums against x' = qx + 128 need 32 bits (4 * 255 * 127 > 2^15), so the sub-block scales cannot
# be applied by packing to i16 as for Q6_K. Per 64 values (two sub-blocks of 32) one vpdpbusd gives 16
# exact i32 lanes started from base = -128 * (4-value sums of w) (the weight block's own, formed once);
# each lane belongs to one sub-block, whose scale d * (ls - 32) (exact: an fp16 times a 6-bit integer) the
# lane's float is multiplied by; the four products are added in order, then dx scales the block's lanes
# into acc: per row 4 vpdpbusd, 4 converts, 4 multiply-adds and one fma.

def _iq4_lookup(builder, c, native):  # <64 x i8> codes 0..15 -> KVALUES_IQ4[c]
    if native:  # vpshufb: each byte indexes the 16-byte table of its 128-bit lane
        table = ir.Constant(_vec(I8, 64), [v & 0xFF for v in KVALUES_IQ4] * 4)
        return _x86(builder, "llvm.x86.avx512.pshuf.b.512", _vec(I8, 64), [(_vec(I8, 64), table), (_vec(I8, 64), c)])
    level = [_const(I8, 64, v) for v in KVALUES_IQ4]  # a tree of 15 selects on the code's bits
    for bit in range(4):
        on = builder.icmp_unsigned("!=", builder.and_(c, _const(I8, 64, 1 << bit)), _const(I8, 64, 0))
        level = [builder.select(on, level[2 * k + 1], level[2 * k]) for k in range(len(level) // 2)]
    return level[0]


def _iq4_xs_block(native: bool, rows: int = 1):
    def unpack(context, builder, tu, u, o):  # the block at u8[o] -> (codes, scales, bases), 4 vectors each
        d = _half(context, builder, tu, u, o)
        sh = builder.zext(builder.load(builder.bitcast(_ptr(context, builder, tu, u, _add(builder, o, 2)),
                                                       I16.as_pointer()), align=1), I32)
        sl = _load(context, builder, tu, u, _add(builder, o, 4), 4)  # <4 x i8>
        # sub-block g: ls = nibble g % 2 of scales_l[g // 2] | bits 2g, 2g + 1 of scales_h << 4
        nibble = ir.Constant(_vec(I8, 8), [4 * (g % 2) for g in range(8)])
        low = builder.and_(builder.lshr(_shuffle(builder, sl, [g // 2 for g in range(8)]), nibble), _const(I8, 8, 15))
        pair = ir.Constant(_vec(I32, 8), [2 * g for g in range(8)])
        high = builder.and_(builder.lshr(_splat(builder, sh, 8), pair), _const(I32, 8, 3))
        ls = builder.or_(builder.zext(low, _vec(I32, 8)), builder.shl(high, _const(I32, 8, 4)))
        centred = builder.sitofp(builder.sub(ls, _const(I32, 8, 32)), _vec(F32, 8))
        scale = builder.fmul(_splat(builder, d, 8), centred)  # d (ls - 32), exact
        codes, scales, bases = [], [], []
        zero = ir.Constant(_vec(I32, 16), None)
        for v in range(4):  # values 64v .. 64v + 63: sub-blocks 2v and 2v + 1
            b = _load(context, builder, tu, u, _add(builder, o, 8 + 32 * v), 32)
            lo, hi = _shuffle(builder, b, range(16)), _shuffle(builder, b, range(16, 32))
            m15, four = _const(I8, 16, 15), _const(I8, 16, 4)
            c = _cat(builder, _cat(builder, builder.and_(lo, m15), builder.lshr(lo, four)),
                     _cat(builder, builder.and_(hi, m15), builder.lshr(hi, four)))
            w = _iq4_lookup(builder, c, native)
            codes.append(w)
            bases.append(builder.sub(zero, _dot4_u8i8(builder, _const(I8, 64, 128), w, native)))
            scales.append(_shuffle(builder, scale, [2 * v] * 8 + [2 * v + 1] * 8))
        return codes, scales, bases

    def body(context, builder, sig, args, offsets):
        tu, tq, tx, ta = sig.args[0], sig.args[rows + 1], sig.args[rows + 4], sig.args[rows + 7]
        u, q, k, n_in, x, j, nb, a, T = (args[0],) + tuple(args[rows + 1:])
        blocks = [unpack(context, builder, tu, u, o) for o in offsets]
        with cgutils.for_range(builder, T) as loop:
            t = loop.index
            kk = builder.add(k, builder.mul(t, n_in))
            xs = [_load(context, builder, tq, q, _add(builder, kk, 64 * v), 64) for v in range(4)]
            e = builder.load(_ptr(context, builder, tx, x, builder.add(j, builder.mul(t, nb))))
            for n, (codes, scales, bases) in enumerate(blocks):
                z = None
                for v in range(4):
                    lanes = builder.sitofp(_dot4_u8i8(builder, xs[v], codes[v], native, bases[v]), _vec(F32, 16))
                    z = builder.fmul(lanes, scales[v]) if z is None else _fma(builder, lanes, scales[v], z)
                i = _add(builder, builder.mul(t, ir.Constant(I64, 16 * rows)), 16 * n)
                r = _fma(builder, z, _splat(builder, e, 16), _load(context, builder, ta, a, i, 16))
                _store(context, builder, ta, a, i, r)
        return _void(context)

    iq4_xs_block = _unsigned_x_intrinsic(body, rows)
    iq4_xs_block.__doc__ = """The IQ4_XS block at u8[o] (d, scales_h, scales_l[4], qs[128]) times input rows t = 0 .. T-1 of
        x' = qx + 128 (qxu[k + t n_in:][:256]): acc[16t:16t+16] += dx[j + t nb] * sum_v s_v * lanes_v,
        lanes_v = base_v + the 4-value sums of x' * w over values 64v .. 64v + 63 (section comment).
        rows = 2: also the block at u8[o2] into acc[32t+16:32t+32], each x' row loaded once for both."""
    return iq4_xs_block


iq4_xs_block, iq4_xs_block2 = _iq4_xs_block(NATIVE_VNNI), _iq4_xs_block(NATIVE_VNNI, rows=2)


q4_k_block, q5_k_block = _k_block("q4_k", NATIVE_MADD, VNNI_LAYOUT), _k_block("q5_k", NATIVE_MADD, VNNI_LAYOUT)
q4_k_block2, q5_k_block2 = (_k_block(kind, NATIVE_MADD, VNNI_LAYOUT, rows=2) for kind in ("q4_k", "q5_k"))
q2_k_block2, q3_k_block2 = (_k_block(kind, NATIVE_MADD, VNNI_LAYOUT, rows=2) for kind in ("q2_k", "q3_k"))
q6_k_block2 = _k_block("q6_k", NATIVE_MADD, VNNI_LAYOUT, rows=2)  # where q6_k_signed_block2 is not (no VNNI)
q2_k_block, q3_k_block = _k_block("q2_k", NATIVE_MADD, VNNI_LAYOUT), _k_block("q3_k", NATIVE_MADD, VNNI_LAYOUT)
q6_k_block = _k_block("q6_k", NATIVE_MADD, VNNI_LAYOUT)  # where q6_k_signed_block is not (no VNNI)
q6_k_signed_block = _q6_k_signed_block(NATIVE_VNNI)
q6_k_signed_block2 = _q6_k_signed_block(NATIVE_VNNI, rows=2)



# ---------------------------------------------------------------------------------------------
# The delta rule's two passes over a K x V state, 16 values of a row at a time (tinyspec/fast/numba_gdn.py).
# Products are rounded, then added (fmul, fadd: no fma), so each lane is the oracle's scalar arithmetic.

@intrinsic
def decay_predict16(typingctx, S0, a, S, b, pred, c, d, kv):
    """s = d * S0[a:a+16];  S[b:b+16] = s;  pred[c:c+16] = pred[c:c+16] + s * kv."""
    if not all(_is_c_array(t, types.float32) for t in (S0, S, pred)):
        return None

    def codegen(context, builder, sig, args):
        t0, _, ts, _, tp = sig.args[:5]
        s0, a, st, b, p, c, d, kv = args
        v = builder.fmul(_splat(builder, d, 16), _load(context, builder, t0, s0, a, 16))
        acc = builder.fadd(_load(context, builder, tp, p, c, 16), builder.fmul(v, _splat(builder, kv, 16)))
        _store(context, builder, ts, st, b, v)
        _store(context, builder, tp, p, c, acc)
        return _void(context)

    return types.void(S0, a, S, b, pred, c, types.float32, types.float32), codegen


@intrinsic
def write_read16(typingctx, S, a, delta, c, kv, o, qv):
    """s = S[a:a+16] + kv * delta[c:c+16];  S[a:a+16] = s;  o[c:c+16] = o[c:c+16] + s * qv."""
    if not all(_is_c_array(t, types.float32) for t in (S, delta, o)):
        return None

    def codegen(context, builder, sig, args):
        ts, _, td, _, _, to = sig.args[:6]
        st, a, dl, c, kv, o, qv = args
        v = builder.fadd(_load(context, builder, ts, st, a, 16),
                         builder.fmul(_splat(builder, kv, 16), _load(context, builder, td, dl, c, 16)))
        acc = builder.fadd(_load(context, builder, to, o, c, 16), builder.fmul(v, _splat(builder, qv, 16)))
        _store(context, builder, ts, st, a, v)
        _store(context, builder, to, o, c, acc)
        return _void(context)

    return types.void(S, a, delta, c, types.float32, o, types.float32), codegen


@intrinsic
def prefetch(typingctx, u8, i):
    """Ask for the cache line holding u8[i] (llvm.prefetch: a hint, never a fault, whatever i is).
    Fetching weights ahead lets a core overlap the decode arithmetic with the DRAM stream; how far ahead
    (numba_ops.AHEAD) is tuned per machine (LESSONS 18; docs/performance-log.md old 19, 35)."""
    if not _is_c_array(u8, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        _prefetch(context, builder, sig.args[0], args[0], args[1])
        return _void(context)

    return types.void(u8, i), codegen


def _prefetch(context, builder, tu, u, i):  # llvm.prefetch of the line holding u8[i]: read, keep, data
    p = builder.bitcast(_ptr(context, builder, tu, u, i), I8.as_pointer())
    fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [p, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _store_stream(context, builder, aryty, ary, i, v):  # a.flat[i:i+len(v)] = v, non-temporal (64-byte aligned)
    st = builder.store(v, builder.bitcast(_ptr(context, builder, aryty, ary, i), v.type.as_pointer()), align=64)
    st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(I32, 1)]))


@intrinsic
def stream16(typingctx, dst, i, src, j):
    """dst[i:i+16] = src[j:j+16] with a streaming (non-temporal) store: the line goes to memory without
    being read first and without evicting hot data (the GDN snapshots: written once, read only on a
    rollback). dst + i must be 64-byte aligned (the caller checks); call `store_fence` before others read."""
    if not (_is_c_array(dst, types.float32) and _is_c_array(src, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        d, i, s, j = args
        _store_stream(context, builder, sig.args[0], d, i, _load(context, builder, sig.args[2], s, j, 16))
        return _void(context)

    return types.void(dst, i, src, j), codegen


@intrinsic
def store_fence(typingctx):
    """A full fence: streaming stores before it are visible to every thread after it."""
    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return _void(context)

    return types.void(), codegen


@intrinsic
def conv4_16(typingctx, x, conv_state, weight, y, new_state, states_out, c0, C, T, keep):
    """Channels c0 .. c0+15 of the w = 4 causal convolution (numba_gdn.causal_conv), T tokens, as vectors:
    weight [C, 4] and conv_state [C, 3] are read as 64 and 48 contiguous floats and split into one vector
    per tap / per window row by shuffles (no transposed copies); then per token
        y[t] = ((((+0.0 + w0 * a) + w1 * b) + w2 * c) + w3 * x[t])       a, b, c: the 3 previous window rows
    (fmul, fadd in the oracle's order), states_out[t] = rows (b, c, x[t]) interleaved back to [16, 3] if keep,
    and the window slides. new_state = the last three rows. Arrays are addressed flat: x, y [T, C]."""
    if not all(_is_c_array(a, types.float32) for a in (x, conv_state, weight, y, new_state, states_out)):
        return None

    def codegen(context, builder, sig, args):
        tx, ts, tw, ty, tn, to = sig.args[:6]
        xa, sa, wa, ya, na, oa, c0, C, T, keep = args
        v16 = _vec(F32, 16)
        wv = _load(context, builder, tw, wa, builder.mul(c0, ir.Constant(I64, 4)), 64)
        taps = [_shuffle(builder, wv, [4 * i + k for i in range(16)]) for k in range(4)]
        sv = _load(context, builder, ts, sa, builder.mul(c0, ir.Constant(I64, 3)), 48)
        rows = [cgutils.alloca_once(builder, v16) for _ in range(3)]  # a, b, c (promoted to registers)
        for j in range(3):
            builder.store(_shuffle(builder, sv, [3 * i + j for i in range(16)]), rows[j])
        interleave = [16 * j + i for i in range(16) for j in range(3)]  # (b, c, x) -> [16, 3] row-major
        with cgutils.for_range(builder, T) as loop:
            t = loop.index
            a, b, c = (builder.load(r) for r in rows)
            cur = _load(context, builder, tx, xa, builder.add(builder.mul(t, C), c0), 16)
            acc = ir.Constant(v16, [0.0] * 16)
            for tap, row in zip(taps, (a, b, c, cur)):
                acc = builder.fadd(acc, builder.fmul(tap, row))
            _store(context, builder, ty, ya, builder.add(builder.mul(t, C), c0), acc)
            with builder.if_then(builder.icmp_unsigned("!=", keep, ir.Constant(keep.type, 0))):
                _store(context, builder, to, oa, builder.mul(builder.add(builder.mul(t, C), c0), ir.Constant(I64, 3)),
                       _shuffle(builder, _cat(builder, _cat(builder, b, c), _cat(builder, cur, cur)), interleave))
            builder.store(b, rows[0])
            builder.store(c, rows[1])
            builder.store(cur, rows[2])
        a, b, c = (builder.load(r) for r in rows)
        _store(context, builder, tn, na, builder.mul(c0, ir.Constant(I64, 3)),
               _shuffle(builder, _cat(builder, _cat(builder, a, b), _cat(builder, c, c)), interleave))
        return _void(context)

    return types.void(x, conv_state, weight, y, new_state, states_out, c0, C, T, keep), codegen


# The delta rule's two passes over one value head's K x V state, whole rows at a time (n16 = V / 16 vectors):
# the V accumulators (pred, o) stay in registers for all K rows instead of a load and a store per row.
# Each element gets the oracle's operations in its order (fmul, fadd; sums over kk = 0, 1, ... from +0.0).

def _rows_loop(builder, K, n16, body):  # for kk in range(K): body(kk, acc values) -> new acc values, from +0.0
    slots = [cgutils.alloca_once(builder, _vec(F32, 16)) for _ in range(n16)]
    for s in slots:
        builder.store(ir.Constant(_vec(F32, 16), [0.0] * 16), s)
    with cgutils.for_range(builder, K) as loop:
        new = body(loop.index, [builder.load(s) for s in slots])
        for s, v in zip(slots, new):
            builder.store(v, s)
    return [builder.load(s) for s in slots]


def _decay_predict_rows(n16: int):
    @intrinsic
    def decay_predict_rows(typingctx, S0, S, K, d, k, pred):
        """s = d * S0[kk];  S[kk] = s;  pred = sum_kk s * k[kk], for the K rows of V = 16 n16 floats (flat arrays)."""
        if not all(_is_c_array(t, types.float32) for t in (S0, S, k, pred)):
            return None

        def codegen(context, builder, sig, args):
            t0, ts, _, _, tk, tp = sig.args
            s0, st, K, d, k, p = args
            dv = _splat(builder, d, 16)

            def body(kk, accs):
                kv = _splat(builder, builder.load(_ptr(context, builder, tk, k, kk)), 16)
                row = builder.mul(kk, ir.Constant(I64, 16 * n16))
                out = []
                for c, acc in enumerate(accs):
                    i = _add(builder, row, 16 * c)
                    v = builder.fmul(dv, _load(context, builder, t0, s0, i, 16))
                    _store(context, builder, ts, st, i, v)
                    out.append(builder.fadd(acc, builder.fmul(v, kv)))
                return out

            for c, acc in enumerate(_rows_loop(builder, K, n16, body)):
                _store(context, builder, tp, p, ir.Constant(I64, 16 * c), acc)
            return _void(context)

        return types.void(S0, S, K, types.float32, k, pred), codegen

    return decay_predict_rows


def _write_read_rows(n16: int):
    @intrinsic
    def write_read_rows(typingctx, S, K, delta, k, q, o, snap, mode):
        """s = S[kk] + k[kk] * delta;  S[kk] = s;  o = sum_kk s * q[kk], for the K rows of V = 16 n16 floats;
        mode 1: snap[kk] = s too, 2: by streaming stores (snap 64-byte aligned), 0: no snapshot."""
        if not all(_is_c_array(t, types.float32) for t in (S, delta, k, q, o, snap)):
            return None

        def codegen(context, builder, sig, args):
            ts, _, tdl, tk, tq, to, tn, _ = sig.args
            st, K, dl, k, q, o, sn, mode = args
            deltas = [_load(context, builder, tdl, dl, ir.Constant(I64, 16 * c), 16) for c in range(n16)]
            keep = builder.icmp_signed("!=", mode, ir.Constant(mode.type, 0))
            stream = builder.icmp_signed("==", mode, ir.Constant(mode.type, 2))

            def body(kk, accs):
                kv = _splat(builder, builder.load(_ptr(context, builder, tk, k, kk)), 16)
                qv = _splat(builder, builder.load(_ptr(context, builder, tq, q, kk)), 16)
                row = builder.mul(kk, ir.Constant(I64, 16 * n16))
                out, vals = [], []
                for c, acc in enumerate(accs):
                    i = _add(builder, row, 16 * c)
                    v = builder.fadd(_load(context, builder, ts, st, i, 16), builder.fmul(kv, deltas[c]))
                    _store(context, builder, ts, st, i, v)
                    vals.append((i, v))
                    out.append(builder.fadd(acc, builder.fmul(v, qv)))
                with builder.if_then(keep):
                    with builder.if_else(stream) as (streamed, plain):
                        with streamed:
                            for i, v in vals:
                                _store_stream(context, builder, tn, sn, i, v)
                        with plain:
                            for i, v in vals:
                                _store(context, builder, tn, sn, i, v)
                return out

            for c, acc in enumerate(_rows_loop(builder, K, n16, body)):
                _store(context, builder, to, o, ir.Constant(I64, 16 * c), acc)
            return _void(context)

        return types.void(S, K, delta, k, q, o, snap, mode), codegen

    return write_read_rows


decay_predict_rows8, write_read_rows8 = _decay_predict_rows(8), _write_read_rows(8)  # V = 128 (Qwen3.5)
