// Q8_0 (see q8_0.wgsl) against Q8_0 activations: d_w * d_x * sum q*x.
const SINGLE_BYTES: u32 = 34u;
#include "include/pairs_i8.wgsl"

// block b of the row at byte wb; sh: the bit offset of the fields after d within their words
fn block_dot_at(wb: u32, b: u32, sh: u32) -> f32 {
    let d = w_f16(wb);
    let i0 = (wb + 2u) >> 2u;
    let xa = xv(2u * b);
    let xb = xv(2u * b + 1u);
    var lo = w[i0];
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        s += dot4I8Packed(funnel(lo, hi, sh), xa[i]);
        lo = hi;
    }
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 5u];
        s += dot4I8Packed(funnel(lo, hi, sh), xb[i]);
        lo = hi;
    }
    return d * xm(b).x * f32(s);
}

#define UNPACK
fn block_unpack(wb: u32) -> WBlock {
    let sh = ((wb + 2u) & 3u) * 8u;
    let i0 = (wb + 2u) >> 2u;
    var blk = WBlock(vec4<u32>(0u), vec4<u32>(0u), w_f16(wb), 0.0, 0.0);
    var lo = w[i0];
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        blk.lo[i] = funnel(lo, hi, sh);
        lo = hi;
    }
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 5u];
        blk.hi[i] = funnel(lo, hi, sh);
        lo = hi;
    }
    return blk;
}
