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
    let h0 = w[v0 + 1u];
    let h1 = w[v0 + 2u];
    // written out, not looped (as include/q4_k_i8.wgsl)
    let j = 16u * b;
    let dots = dot(k.sc_a, vec4<i32>(sub_pair(v0 + 3u, h0, h1, 0u, j), sub_pair(v0 + 5u, h0, h1, 2u, j + 4u)))
             + dot(k.sc_b, vec4<i32>(sub_pair(v0 + 7u, h0, h1, 4u, j + 8u), sub_pair(v0 + 9u, h0, h1, 6u, j + 12u)));
    let xs = x_sums32(b);
    let mins = dot(k.m_a, xs[0]) + dot(k.m_b, xs[1]);
    return xm(5u * b).x * (dm.x * f32(dots) - dm.y * f32(mins));
}

// sub-blocks c and c + 1 (c even): the low and high nibbles of quant vec4s v, v + 1 with bits c, c + 1
// of the high-bit vec4s h0 (elements 0-15 of each) and h1 (16-31), against activation vec4s j..j+3
fn sub_pair(v: u32, h0: vec4<u32>, h1: vec4<u32>, c: u32, j: u32) -> vec2<i32> {
    let q0 = w[v];
    let q1 = w[v + 1u];
    let lo = vec4<u32>(c);
    let hi = vec4<u32>(c + 1u);
    let four = vec4<u32>(4u);
    return vec2<i32>(dot16((q0 & NIB) | (((h0 >> lo) & BIT) << four), xv(j))
                   + dot16((q1 & NIB) | (((h1 >> lo) & BIT) << four), xv(j + 1u)),
                     dot16(((q0 >> four) & NIB) | (((h0 >> hi) & BIT) << four), xv(j + 2u))
                   + dot16(((q1 >> four) & NIB) | (((h1 >> hi) & BIT) << four), xv(j + 3u)));
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
