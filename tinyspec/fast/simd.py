"""simd: the few explicit vector operations the Numba kernels need, written as LLVM IR (Numba intrinsics).

Why not plain Numba loops: a 16- or 32-wide loop with a constant trip count is fully unrolled by LLVM
before its loop vectorizer runs, and the SLP vectorizer then refuses to merge the scalar lanes because
a store to one Numba array may alias a load from another (Numba marks no array `noalias`). Measured at
the Qwen3.5-0.8B shapes, that scalar code ran at 0.5-1.5 GB/s of weights on one core. Each intrinsic
here loads its operands as one vector, computes, and stores - one `<16 x float>` fma is one AVX-512
instruction, two AVX2 ones, four NEON ones: LLVM legalizes the width for the host CPU.

Every operation is an ordinary IEEE float32 operation in a fixed order: fmul, fsub, uitofp/sitofp of
small integers (exact), llvm.fma (rounded once), fadd in a fixed tree. No fast-math flags, so LLVM may
neither reassociate nor contract; the bits a lane gets do not depend on the vector width.

Arrays are addressed as `a.flat[i:i + n]`: the array must be C-contiguous (checked at typing) and the
caller keeps `i + n <= a.size` (these are inner-loop primitives: no bounds check).

    fma16(acc, i, w, j, x, k)          acc[i:i+16] = fma(w[j:j+16], x[k:k+16], acc[i:i+16])   (and fma256)
    lane_sum256(a, i)                  a[i] + ... + a[i+255] as a fixed pairwise tree: (l, l+128), (l, l+64), ...
    half_to_f32(u8, i)                 the fp16 at bytes u8[i], u8[i+1] (little endian) as float32, exact
    affine_u4(u8, i, w, j, s0, m0, s1, m1)   32 bytes -> w[j:j+32] = s0 * (b & 15) - m0, w[j+32:j+64] = s1 * (b >> 4) - m1
    ...and the block-specific decoders below (Q4_K scales, Q5_K fifth bit, Q6_K, Q8_0, Q4_0).
"""

from __future__ import annotations

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
def lane_sum256(typingctx, a, i):
    """a[i] + ... + a[i + 255] by the fixed tree v[l] += v[l + h], h = 128, 64, ..., 1."""
    if not _is_c_array(a, types.float32):
        return None

    def codegen(context, builder, sig, args):
        v, n = _load(context, builder, sig.args[0], args[0], args[1], 256), 256
        while n > 1:
            n //= 2
            v = builder.fadd(_shuffle(builder, v, range(n)), _shuffle(builder, v, range(n, 2 * n)))
        return builder.extract_element(v, ir.Constant(I32, 0))

    return types.float32(a, i), codegen


@intrinsic
def half_to_f32(typingctx, u8, i):
    """The IEEE half at u8[i], u8[i + 1] (little endian) widened to float32: exact (F16C vcvtph2ps)."""
    if not _is_c_array(u8, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        h = builder.load(builder.bitcast(_ptr(context, builder, sig.args[0], args[0], args[1]),
                                         ir.HalfType().as_pointer()), align=1)
        return builder.fpext(h, F32)

    return types.float32(u8, i), codegen


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
        q = _load(context, builder, tu, u, i, 12)
        k = lambda c: _const(I8, 8, c)  # noqa: E731
        a, b = _shuffle(builder, q, [0, 1, 2, 3, 8, 9, 10, 11]), _shuffle(builder, q, [0, 0, 0, 0, 0, 1, 2, 3])
        c, e = _shuffle(builder, q, [4, 5, 6, 7, 8, 9, 10, 11]), _shuffle(builder, q, [0, 0, 0, 0, 4, 5, 6, 7])
        low = ir.Constant(_vec(ir.IntType(1), 8), [1, 1, 1, 1, 0, 0, 0, 0])
        sc = builder.select(low, builder.and_(a, k(63)),
                            builder.or_(builder.and_(a, k(15)), builder.shl(builder.lshr(b, k(6)), k(4))))
        m = builder.select(low, builder.and_(c, k(63)),
                           builder.or_(builder.lshr(c, k(4)), builder.shl(builder.lshr(e, k(6)), k(4))))
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
