// Q5_K (see q5_k.wgsl) against Q8_K activations: as Q4_K with 5-bit values. A block is 176 bytes, 11
// vec4s (W_VEC4, always, as Q4_K): d, dmin and scales; the high bits of elements 0-15 (bit c of byte i
// for sub-block c) and of 16-31; then the quants as Q4_K's.
#include "include/kscales.wgsl"
#include "include/kscales_i8.wgsl"
#include "include/pieces_i8.wgsl"
#define PIECES 8u
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;
const NIB: vec4<u32> = vec4<u32>(0x0F0F0F0Fu);
const BIT: vec4<u32> = vec4<u32>(0x01010101u);

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
            let q = w[v0 + 3u + 2u * c + j];
            let h = w[v0 + 1u + j];
            let q_lo = (q & NIB) | (((h >> vec4<u32>(2u * c)) & BIT) << vec4<u32>(4u));
            let q_hi = ((q >> vec4<u32>(4u)) & NIB) | (((h >> vec4<u32>(2u * c + 1u)) & BIT) << vec4<u32>(4u));
            s_lo += dot16(q_lo, xv(16u * b + 4u * c + j));
            s_hi += dot16(q_hi, xv(16u * b + 4u * c + 2u + j));
        }
        let sc = select(k.sc_b, k.sc_a, c < 2u);        // sub-blocks 2c, 2c + 1
        dots += sc[2u * (c & 1u)] * s_lo + sc[2u * (c & 1u) + 1u] * s_hi;
    }
    let xs = x_sums32(b);
    let mins = dot(k.m_a, xs[0]) + dot(k.m_b, xs[1]);
    return xm(5u * b).x * (dm.x * f32(dots) - dm.y * f32(mins));
}

// TOKENS (include/pieces_i8.wgsl): piece p is sub-block p, nibbles as Q4_K's and bit p of the high-bit bytes
fn block_head(wb: u32) -> KHead {
    let head = w[wb >> 4u];
    let dm = unpack2x16float(head.x);
    return KHead(dm.x, dm.y, vec4<u32>(head.yzw, 0u));
}

fn piece_unpack(wb: u32, head: KHead, p: u32) -> WPiece {
    let v0 = wb >> 4u;
    let q0 = v0 + 3u + 2u * (p >> 1u);
    let sh = vec4<u32>(4u * (p & 1u));
    let hp = vec4<u32>(p);
    return WPiece(((w[q0] >> sh) & NIB) | (((w[v0 + 1u] >> hp) & BIT) << vec4<u32>(4u)),
                  ((w[q0 + 1u] >> sh) & NIB) | (((w[v0 + 2u] >> hp) & BIT) << vec4<u32>(4u)),
                  vec2<i32>(k_scale_min(head.s, p)));
}

fn piece_apply(pc: WPiece, xa: vec4<u32>, xb: vec4<u32>, sums: vec2<i32>) -> vec2<i32> {
    return vec2<i32>(pc.sc.x * (dot16(pc.lo, xa) + dot16(pc.hi, xb)), pc.sc.y * (sums.x + sums.y));
}

fn block_finish(head: KHead, s: vec2<i32>, dx: f32) -> f32 {
    return dx * (head.d * f32(s.x) - head.dmin * f32(s.y));
}
