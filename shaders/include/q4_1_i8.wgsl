// Q4_1 (see q4_1.wgsl) against Q8_1 activations: d_w * d_x * sum q*x + m_w * s_x (s_x: Q8_1's f16 sum).
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn block_unpack(wb: u32) -> WBlock {
    let i0 = wb >> 2u;              // 20 is a multiple of 4: this block is word-aligned
    let dm = unpack2x16float(w[i0]);
    var blk = WBlock(vec4<u32>(0u), vec4<u32>(0u), dm.x, 0.0, dm.y);
    for (var i = 0u; i < 4u; i++) {
        let q = w[i0 + 1u + i];
        blk.lo[i] = q & 0x0F0F0F0Fu;
        blk.hi[i] = (q >> 4u) & 0x0F0F0F0Fu;
    }
    return blk;
}

fn block_dot(wb: u32, b: u32) -> f32 {
    return block_apply(block_unpack(wb), xv(2u * b), xv(2u * b + 1u), xm(b));
}
