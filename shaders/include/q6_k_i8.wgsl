// Q6_K (see q6_k.wgsl) against Q8_K activations: per 16-value group g with int8 scale sc_g,
// d * d_x * sum_g sc_g * ((q.x)_g - 32 * (sum x)_g), q the unsigned 6-bit values; sums in integers.
// Group g's 16-sum sits at the same index as its scale (elements 16g..16g+15).
#include "include/pieces_i8.wgsl"
#define PIECES 8u
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn i8_of(words: vec4<u32>, k: u32) -> i32 {
    return bitcast<i32>(byte_of(words, k) << 24u) >> 24u;
}

fn block_dot(wb: u32, b: u32) -> f32 {
    let i0 = wb >> 2u;
    let sh = (wb & 3u) * 8u;
    let d = w_f16(wb + 208u);
    let sw = vec4<u32>(funnel(w[i0 + 48u], w[i0 + 49u], sh), funnel(w[i0 + 49u], w[i0 + 50u], sh),
                       funnel(w[i0 + 50u], w[i0 + 51u], sh), funnel(w[i0 + 51u], w[i0 + 52u], sh));
    var total = 0i;
    for (var n = 0u; n < 2u; n++) {
        var lo_a = w[i0 + 16u * n];             // ql[64n..]
        var lo_b = w[i0 + 16u * n + 8u];        // ql[64n+32..]
        var lo_h = w[i0 + 32u + 8u * n];        // qh[32n..]
        let sums_a = vec4<i32>(xm(5u * b + 1u + 2u * n));      // groups 8n..8n+3
        let sums_b = vec4<i32>(xm(5u * b + 2u + 2u * n));      // groups 8n+4..8n+7
        for (var g = 0u; g < 2u; g++) {
            let x1 = xv(16u * b + 8u * n + g);          // elements 128n + 16g..: v1
            let x2 = xv(16u * b + 8u * n + 2u + g);     // +32: v2
            let x3 = xv(16u * b + 8u * n + 4u + g);     // +64: v3
            let x4 = xv(16u * b + 8u * n + 6u + g);     // +96: v4
            var s = vec4<i32>(0);
            for (var ii = 0u; ii < 4u; ii++) {
                let i = 4u * g + ii;
                let hi_a = w[i0 + 16u * n + i + 1u];
                let hi_b = w[i0 + 16u * n + 8u + i + 1u];
                let hi_h = w[i0 + 32u + 8u * n + i + 1u];
                let a = funnel(lo_a, hi_a, sh);
                let bq = funnel(lo_b, hi_b, sh);
                let h = funnel(lo_h, hi_h, sh);
                lo_a = hi_a;
                lo_b = hi_b;
                lo_h = hi_h;
                s.x += dot4I8Packed((a & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4u), x1[ii]);
                s.y += dot4I8Packed((bq & 0x0F0F0F0Fu) | (((h >> 2u) & 0x03030303u) << 4u), x2[ii]);
                s.z += dot4I8Packed(((a >> 4u) & 0x0F0F0F0Fu) | (((h >> 4u) & 0x03030303u) << 4u), x3[ii]);
                s.w += dot4I8Packed(((bq >> 4u) & 0x0F0F0F0Fu) | (((h >> 6u) & 0x03030303u) << 4u), x4[ii]);
            }
            let k = 8u * n + g;
            let sums = vec4<i32>(sums_a[g], sums_a[g + 2u], sums_b[g], sums_b[g + 2u]);
            let sc = vec4<i32>(i8_of(sw, k), i8_of(sw, k + 2u), i8_of(sw, k + 4u), i8_of(sw, k + 6u));
            let v = sc * (s - 32 * sums);
            total += v.x + v.y + v.z + v.w;
        }
    }
    return d * xm(5u * b).x * f32(total);
}

// TOKENS (include/pieces_i8.wgsl): piece p = 4n + q is the q-th 32 values of half n: the low (q < 2) or
// high nibbles of 32 ql bytes, with bits 2q, 2q+1 of 32 qh bytes; its groups are 2p and 2p + 1
fn block_head(wb: u32) -> KHead {
    let i0 = wb >> 2u;
    let sh = (wb & 3u) * 8u;
    return KHead(w_f16(wb + 208u), 0.0, vec4<u32>(funnel(w[i0 + 48u], w[i0 + 49u], sh), funnel(w[i0 + 49u], w[i0 + 50u], sh),
                                                  funnel(w[i0 + 50u], w[i0 + 51u], sh), funnel(w[i0 + 51u], w[i0 + 52u], sh)));
}

fn piece_unpack(wb: u32, head: KHead, p: u32) -> WPiece {
    let i0 = wb >> 2u;
    let sh = (wb & 3u) * 8u;
    let n = p >> 2u;
    let q = p & 3u;
    let l0 = i0 + 16u * n + 8u * (q & 1u);
    let h0 = i0 + 32u + 8u * n;
    let nib = 4u * (q >> 1u);
    var pc = WPiece(vec4<u32>(0u), vec4<u32>(0u), vec2<i32>(i8_of(head.s, 2u * p), i8_of(head.s, 2u * p + 1u)));
    var lo_l = w[l0];
    var lo_h = w[h0];
    for (var i = 0u; i < 8u; i++) {
        let hi_l = w[l0 + i + 1u];
        let hi_h = w[h0 + i + 1u];
        let v = ((funnel(lo_l, hi_l, sh) >> nib) & 0x0F0F0F0Fu) | (((funnel(lo_h, hi_h, sh) >> (2u * q)) & 0x03030303u) << 4u);
        if (i < 4u) {
            pc.lo[i] = v;
        } else {
            pc.hi[i - 4u] = v;
        }
        lo_l = hi_l;
        lo_h = hi_h;
    }
    return pc;
}

fn piece_apply(pc: WPiece, xa: vec4<u32>, xb: vec4<u32>, sums: vec2<i32>) -> vec2<i32> {
    return vec2<i32>(pc.sc.x * (dot16(pc.lo, xa) - 32 * sums.x) + pc.sc.y * (dot16(pc.hi, xb) - 32 * sums.y), 0);
}

fn block_finish(head: KHead, s: vec2<i32>, dx: f32) -> f32 {
    return head.d * dx * f32(s.x);
}
