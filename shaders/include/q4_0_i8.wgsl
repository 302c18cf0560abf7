// Q4_0 (see q4_0.wgsl) against Q8_0 activations: d_w * d_x * (sum q*x - 8 * sum x), q the raw nibbles.
const SINGLE_BYTES: u32 = 18u;
#include "include/pairs_i8.wgsl"

// the block at byte wb; sh: the bit offset of the fields after d within their words
fn block_unpack_at(wb: u32, sh: u32) -> WBlock {
    let i0 = (wb + 2u) >> 2u;
    var blk = WBlock(vec4<u32>(0u), vec4<u32>(0u), w_f16(wb), 8.0, 0.0);
    var lo = w[i0];
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        let q = funnel(lo, hi, sh);
        blk.lo[i] = q & 0x0F0F0F0Fu;            // elements 4i..: the low nibbles
        blk.hi[i] = (q >> 4u) & 0x0F0F0F0Fu;    // 16 + 4i..: the high nibbles
        lo = hi;
    }
    return blk;
}

fn block_unpack(wb: u32) -> WBlock {
    return block_unpack_at(wb, ((wb + 2u) & 3u) * 8u);
}

fn block_dot_at(wb: u32, b: u32, sh: u32) -> f32 {
    return block_apply(block_unpack_at(wb, sh), xv(2u * b), xv(2u * b + 1u), xm(b));
}
