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

#ifdef LANES
// A block against a token pair's lane words (lanes.wgsl): e0..e3 its elements 0..15, f0..f3 16..31.
struct PairWords {
    e0: vec4<i32>, e1: vec4<i32>, e2: vec4<i32>, e3: vec4<i32>,
    f0: vec4<i32>, f1: vec4<i32>, f2: vec4<i32>, f3: vec4<i32>,
}

// a word's 4 bytes as unsigned values (the 4-bit types' unpacked quants, 0..15); by shifts and a mask, not
// unpack4xU8, which SwiftShader made slower here (Q4_1 1536x576, 4 tokens: 2.4 -> 4.0 ms natively)
fn bytes4(v: u32) -> vec4<i32> {
    return vec4<i32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}

// sum q*x over 16 elements for both tokens of a pair: one i32 multiply-add per element, the low token's
// sum (under 2^15 in magnitude: 16 * 15 * 127) sign-extended out of the low half, the high token's above it
fn lanes16(q: vec4<u32>, a: vec4<i32>, b: vec4<i32>, c: vec4<i32>, d: vec4<i32>) -> vec2<i32> {
    let s = dot(bytes4(q.x), a) + dot(bytes4(q.y), b) + dot(bytes4(q.z), c) + dot(bytes4(q.w), d);
    let lo = (s << 16u) >> 16u;
    return vec2<i32>(lo, (s - lo) >> 16u);
}

// block_apply for both tokens of a pair (m0, m1: their block metadata): the same integer sums, so the
// same floats
fn block_lanes(blk: WBlock, p: PairWords, m0: vec4<f32>, m1: vec4<f32>) -> vec2<f32> {
    let s = lanes16(blk.lo, p.e0, p.e1, p.e2, p.e3) + lanes16(blk.hi, p.f0, p.f1, p.f2, p.f3);
    return vec2<f32>(blk.d * m0.x * (f32(s.x) - blk.off * m0.z) + blk.dmin * m0.y,
                     blk.d * m1.x * (f32(s.y) - blk.off * m1.z) + blk.dmin * m1.y);
}
#endif
