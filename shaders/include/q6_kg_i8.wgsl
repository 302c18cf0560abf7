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
    var total = 0i;
    for (var n = 0u; n < 2u; n++) {
        let sums_a = vec4<i32>(xm(5u * b + 1u + 2u * n));      // groups 8n..8n+3
        let sums_b = vec4<i32>(xm(5u * b + 2u + 2u * n));      // groups 8n+4..8n+7
        let sc_a = unpack4xI8(sw[2u * n]);                      // their scales
        let sc_b = unpack4xI8(sw[2u * n + 1u]);
        for (var g = 0u; g < 2u; g++) {
            let a = q6g_ql(i, 4u * n + g);
            let bq = q6g_ql(i, 4u * n + 2u + g);
            let h = q6g_qh(i, 2u * n + g);
            let x0 = 16u * b + 8u * n + g;                      // elements 128n + 16g.., then +32, +64, +96
            let s = vec4<i32>(dot16(q6g_values(a, h, 0u, 0u), xv(x0)), dot16(q6g_values(bq, h, 0u, 1u), xv(x0 + 2u)),
                              dot16(q6g_values(a, h, 4u, 2u), xv(x0 + 4u)), dot16(q6g_values(bq, h, 4u, 3u), xv(x0 + 6u)));
            let sums = vec4<i32>(sums_a[g], sums_a[g + 2u], sums_b[g], sums_b[g + 2u]);
            let sc = vec4<i32>(sc_a[g], sc_a[g + 2u], sc_b[g], sc_b[g + 2u]);         // groups 8n + g + 2q
            let v = sc * (s - 32 * sums);
            total += v.x + v.y + v.z + v.w;
        }
    }
    return q6g_d(i) * xm(5u * b).x * f32(total);
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
