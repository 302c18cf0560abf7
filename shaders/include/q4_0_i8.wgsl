// Q4_0 (see q4_0.wgsl) against Q8_0 activations: d_w * d_x * (sum q*x - 8 * sum x), q the raw nibbles.
const SINGLE_BYTES: u32 = 18u;
#include "include/pairs_i8.wgsl"

// block b of the row at byte wb; sh: the bit offset of the fields after d within their words
fn block_dot_at(wb: u32, b: u32, sh: u32) -> f32 {
    let d = w_f16(wb);
    let i0 = (wb + 2u) >> 2u;
    let xa = xv(2u * b);            // elements 0..15: the low nibbles
    let xb = xv(2u * b + 1u);       // 16..31: the high nibbles
    var lo = w[i0];
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        let q = funnel(lo, hi, sh);
        s += dot4I8Packed(q & 0x0F0F0F0Fu, xa[i]) + dot4I8Packed((q >> 4u) & 0x0F0F0F0Fu, xb[i]);
        lo = hi;
    }
    let m = xm(b);
    return d * m.x * (f32(s) - 8.0 * m.z);
}

#define UNPACK
fn block_unpack(wb: u32) -> WBlock {
    let sh = ((wb + 2u) & 3u) * 8u;
    let i0 = (wb + 2u) >> 2u;
    var blk = WBlock(vec4<u32>(0u), vec4<u32>(0u), w_f16(wb), 8.0, 0.0);
    var lo = w[i0];
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        let q = funnel(lo, hi, sh);
        blk.lo[i] = q & 0x0F0F0F0Fu;
        blk.hi[i] = (q >> 4u) & 0x0F0F0F0Fu;
        lo = hi;
    }
    return blk;
}
