// Q5_0 (see q5_0.wgsl) against Q8_0 activations: d_w * d_x * (sum q*x - 16 * sum x), q the 5-bit values.
const SINGLE_BYTES: u32 = 22u;
#include "include/pairs_i8.wgsl"

// the block at byte wb; sh: the bit offset of the fields after d within their words
fn block_unpack_at(wb: u32, sh: u32) -> WBlock {
    let i0 = (wb + 2u) >> 2u;
    var blk = WBlock(vec4<u32>(0u), vec4<u32>(0u), w_f16(wb), 16.0, 0.0);
    var lo = w[i0 + 1u];
    let qh = funnel(w[i0], lo, sh);
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 2u];
        let q = funnel(lo, hi, sh);
        blk.lo[i] = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4u * i)) << 4u);
        blk.hi[i] = ((q >> 4u) & 0x0F0F0F0Fu) | (spread4(qh >> (16u + 4u * i)) << 4u);
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
