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
    var dots = 0i;
    for (var c = 0u; c < 4u; c++) {
        var s_lo = 0i;
        var s_hi = 0i;
        for (var j = 0u; j < 2u; j++) {
            let q = w[v0 + 1u + 2u * c + j];
            s_lo += dot16(q & NIB, xv(16u * b + 4u * c + j));                        // elements 64c + 16j ..
            s_hi += dot16((q >> vec4<u32>(4u)) & NIB, xv(16u * b + 4u * c + 2u + j)); // 64c + 32 + 16j ..
        }
        let sc = select(k.sc_b, k.sc_a, c < 2u);        // sub-blocks 2c, 2c + 1
        dots += sc[2u * (c & 1u)] * s_lo + sc[2u * (c & 1u) + 1u] * s_hi;
    }
    let xs = x_sums32(b);
    let mins = dot(k.m_a, xs[0]) + dot(k.m_b, xs[1]);
    return xm(5u * b).x * (dm.x * f32(dots) - dm.y * f32(mins));
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
