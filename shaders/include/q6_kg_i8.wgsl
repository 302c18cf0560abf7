// Q6_K (see q6_k.wgsl) in groups of 8 blocks (repack.wgsl's layout, include/q6_kg_at.wgsl) against Q8_K
// activations: per 16-value group g with int8 scale sc_g, d * d_x * sum_g sc_g * ((q.x)_g - 32 * (sum x)_g),
// q the unsigned 6-bit values, sums in integers (group g's 16-sum sits at the index of its scale).
// Why grouped: the file's 210-byte blocks straddle words, so each invocation would load them a word at a
// time (a gather per word on CPU adapters); grouped, every field is whole vec4s. lavapipe 2048x4096 one
// token: 1.7-2.4 G elements/s file layout, 3.3-4.7 grouped.
#include "include/q6_kg_at.wgsl"
#include "include/pieces_i8.wgsl"
#define PIECES 8u
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn i8_of(words: vec4<u32>, k: u32) -> i32 {
    return bitcast<i32>(byte_of(words, k) << 24u) >> 24u;
}

fn block_dot(wb: u32, b: u32) -> f32 {
    let i = wb / BLOCK_BYTES;
    let sw = q6g_scales(i);
    // written out, not looped (as include/q4_k_i8.wgsl): each quarter's sums and scales are swizzles
    let sums0 = vec4<i32>(xm(5u * b + 1u));     // groups 0..3, then 4..7, 8..11, 12..15
    let sums1 = vec4<i32>(xm(5u * b + 2u));
    let sums2 = vec4<i32>(xm(5u * b + 3u));
    let sums3 = vec4<i32>(xm(5u * b + 4u));
    let sc0 = unpack4xI8(sw.x);
    let sc1 = unpack4xI8(sw.y);
    let sc2 = unpack4xI8(sw.z);
    let sc3 = unpack4xI8(sw.w);
    let x0 = 16u * b;
    let v = q6g_quarter(i, 0u, x0, vec4<i32>(sc0.xz, sc1.xz), vec4<i32>(sums0.xz, sums1.xz))
          + q6g_quarter(i, 1u, x0 + 1u, vec4<i32>(sc0.yw, sc1.yw), vec4<i32>(sums0.yw, sums1.yw))
          + q6g_quarter(i, 4u, x0 + 8u, vec4<i32>(sc2.xz, sc3.xz), vec4<i32>(sums2.xz, sums3.xz))
          + q6g_quarter(i, 5u, x0 + 9u, vec4<i32>(sc2.yw, sc3.yw), vec4<i32>(sums2.yw, sums3.yw));
    return q6g_d(i) * xm(5u * b).x * f32(v.x + v.y + v.z + v.w);
}

// the four 16-value groups that share qh vec4 (v & 1) + v / 2 (v = 4n + g: elements 128n + 16g + 32q for
// q = 0..3), from activation vec4 x0 on: their scales sc and 16-sums times (dot - 32 * sum). Each q's two
// qh bits are shifted straight to bits 4-5 and masked there (q6g_values shifts them down, masks and shifts
// up: one op more, two for q = 2): SwiftShader 4096x4096 0.56-0.63 -> 0.62-0.70 G elements/s, lavapipe level.
fn q6g_quarter(i: u32, v: u32, x0: u32, sc: vec4<i32>, sums: vec4<i32>) -> vec4<i32> {
    let a = q6g_ql(i, v);
    let bq = q6g_ql(i, v + 2u);
    let h = q6g_qh(i, (v >> 1u) + (v & 1u));
    let lo = vec4<u32>(0x0F0F0F0Fu);
    let top = vec4<u32>(0x30303030u);
    let s = vec4<i32>(dot16((a & lo) | ((h << vec4<u32>(4u)) & top), xv(x0)),
                      dot16((bq & lo) | ((h << vec4<u32>(2u)) & top), xv(x0 + 2u)),
                      dot16(((a >> vec4<u32>(4u)) & lo) | (h & top), xv(x0 + 4u)),
                      dot16(((bq >> vec4<u32>(4u)) & lo) | ((h >> vec4<u32>(2u)) & top), xv(x0 + 6u)));
    return sc * (s - 32 * sums);
}

// TOKENS (include/pieces_i8.wgsl): piece p = 4n + q is the q-th 32 values of half n: the low (q < 2) or
// high nibbles of 32 ql bytes, with bits 2q, 2q + 1 of 32 qh bytes; its groups are 2p and 2p + 1
fn block_head(wb: u32) -> KHead {
    let i = wb / BLOCK_BYTES;
    return KHead(q6g_d(i), 0.0, q6g_scales(i));
}

fn piece_unpack(wb: u32, head: KHead, p: u32) -> WPiece {
    let i = wb / BLOCK_BYTES;
    let n = p >> 2u;
    let q = p & 3u;
    let v = 4u * n + 2u * (q & 1u);
    let nib = 4u * (q >> 1u);
    return WPiece(q6g_values(q6g_ql(i, v), q6g_qh(i, 2u * n), nib, q), q6g_values(q6g_ql(i, v + 1u), q6g_qh(i, 2u * n + 1u), nib, q),
                  vec2<i32>(i8_of(head.s, 2u * p), i8_of(head.s, 2u * p + 1u)));
}

fn piece_apply(pc: WPiece, xa: vec4<u32>, xb: vec4<u32>, sums: vec2<i32>) -> vec2<i32> {
    return vec2<i32>(pc.sc.x * (dot16(pc.lo, xa) - 32 * sums.x) + pc.sc.y * (dot16(pc.hi, xb) - 32 * sums.y), 0);
}

fn block_finish(head: KHead, s: vec2<i32>, dx: f32) -> f32 {
    return head.d * dx * f32(s.x);
}
