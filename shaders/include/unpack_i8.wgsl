// The 32-value block types' weights unpacked once into int8 words (block_unpack, which each of their
// decoders defines), then dotted with any number of activation rows (block_apply): the TOKENS variant
// of matvec_i8 shares one unpacking among several tokens. Same arithmetic as the decoders' block_dot:
// d_w * d_x * (sum q*x - off * sum x) + m_w * s_x.
struct WBlock {
    lo: vec4<u32>,      // elements 0..15 as int8 (unsigned nibbles / 5-bit values for the offset types)
    hi: vec4<u32>,      // elements 16..31
    d: f32,
    off: f32,           // what the stored values are offset by (8 for Q4_0, 16 for Q5_0, else 0)
    dmin: f32,          // Q4_1's m (times Q8_1's s), else 0
}

fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, x.x) + dot4I8Packed(q.y, x.y) + dot4I8Packed(q.z, x.z) + dot4I8Packed(q.w, x.w);
}

// xa, xb: the token's int8 words of the block's elements 0..15 and 16..31; m: its block metadata
fn block_apply(blk: WBlock, xa: vec4<u32>, xb: vec4<u32>, m: vec4<f32>) -> f32 {
    let s = dot16(blk.lo, xa) + dot16(blk.hi, xb);
    return blk.d * m.x * (f32(s) - blk.off * m.z) + blk.dmin * m.y;
}
