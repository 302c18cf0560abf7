// Q4_K (see q4_k.wgsl) against Q8_K activations: per 32-value sub-block j with 6-bit scale sc_j and min
// m_j, d_x * (d * sum_j sc_j * (q.x)_j - dmin * sum_j m_j * (sum x)_j), the sums in integers.
// A block is 144 bytes, 9 vec4s (W_VEC4, which matvec_i8_key always sets for this type): vec4 0 holds d,
// dmin and the 12 scale bytes, vec4 1 + 2c + j the 16 quant bytes of elements 64c + 16j.. (low nibbles)
// and 64c + 32 + 16j.. (high). Loading 16 bytes at a time matters on CPU adapters, where each invocation's
// load is a gather: lavapipe 2048x4096 one token, 4.2-4.4 G elements/s with word loads, 5.0-5.3 with vec4s.
#include "include/kscales.wgsl"
#include "include/kscales_i8.wgsl"
#include "include/pieces_i8.wgsl"
#define PIECES 8u
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;
const NIB: vec4<u32> = vec4<u32>(0x0F0F0F0Fu);

fn block_dot(wb: u32, b: u32) -> f32 {
    let v0 = wb >> 4u;
    let head = w[v0];
    let dm = unpack2x16float(head.x);
    let k = k_scales(head.yzw);
    // written out, not looped: on SwiftShader a loop costs its lanes' mask upkeep each pass, and a
    // vector indexed by the loop's counter is indexed per lane
    let j = 16u * b;
    let dots = dot(k.sc_a, vec4<i32>(sub_pair(v0 + 1u, j), sub_pair(v0 + 3u, j + 4u)))
             + dot(k.sc_b, vec4<i32>(sub_pair(v0 + 5u, j + 8u), sub_pair(v0 + 7u, j + 12u)));
    let xs = x_sums32(b);
    let mins = dot(k.m_a, xs[0]) + dot(k.m_b, xs[1]);
    return xm(5u * b).x * (dm.x * f32(dots) - dm.y * f32(mins));
}

// sub-blocks 2c and 2c + 1 of a block: the low and high nibbles of its quant vec4s v, v + 1, against
// the activations' vec4s j..j+3
fn sub_pair(v: u32, j: u32) -> vec2<i32> {
    let q0 = w[v];
    let q1 = w[v + 1u];
    return vec2<i32>(dot16(q0 & NIB, xv(j)) + dot16(q1 & NIB, xv(j + 1u)),
                     dot16((q0 >> vec4<u32>(4u)) & NIB, xv(j + 2u)) + dot16((q1 >> vec4<u32>(4u)) & NIB, xv(j + 3u)));
}

// TOKENS (include/pieces_i8.wgsl): piece p is sub-block p, the low (even p) or high nibbles of 32 bytes
fn block_head(wb: u32) -> KHead {
    let head = w[wb >> 4u];
    let dm = unpack2x16float(head.x);
    return KHead(dm.x, dm.y, vec4<u32>(head.yzw, 0u));
}

fn piece_unpack(wb: u32, head: KHead, p: u32) -> WPiece {
    let q0 = (wb >> 4u) + 1u + 2u * (p >> 1u);
    let sh = vec4<u32>(4u * (p & 1u));
    return WPiece((w[q0] >> sh) & NIB, (w[q0 + 1u] >> sh) & NIB, vec2<i32>(k_scale_min(head.s, p)));
}

// sums: the token's two sums of 16 over the piece's elements
fn piece_apply(pc: WPiece, xa: vec4<u32>, xb: vec4<u32>, sums: vec2<i32>) -> vec2<i32> {
    return vec2<i32>(pc.sc.x * (dot16(pc.lo, xa) + dot16(pc.hi, xb)), pc.sc.y * (sums.x + sums.y));
}

fn block_finish(head: KHead, s: vec2<i32>, dx: f32) -> f32 {
    return dx * (head.d * f32(s.x) - head.dmin * f32(s.y));
}

#ifdef LANES
// piece_apply for both tokens of a pair (include/unpack_i8.wgsl's lanes16; sums0, sums1: their sums of 16):
// (token 0's two sums, token 1's)
fn piece_lanes(pc: WPiece, pw: PairWords, sums0: vec2<i32>, sums1: vec2<i32>) -> vec4<i32> {
    let s = lanes16(pc.lo, pw.e0, pw.e1, pw.e2, pw.e3) + lanes16(pc.hi, pw.f0, pw.f1, pw.f2, pw.f3);
    return vec4<i32>(pc.sc.x * s.x, pc.sc.y * (sums0.x + sums0.y), pc.sc.x * s.y, pc.sc.y * (sums1.x + sums1.y));
}
#endif
