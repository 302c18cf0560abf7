// Q5_K (see q5_k.wgsl) against Q8_K activations: as Q4_K with 5-bit values.
#include "include/kscales.wgsl"
#include "include/pieces_i8.wgsl"
#define PIECES 8u
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn block_dot(wb: u32, b: u32) -> f32 {
    let i0 = wb >> 2u;
    let dm = unpack2x16float(w[i0]);
    let s = vec4<u32>(w[i0 + 1u], w[i0 + 2u], w[i0 + 3u], 0u);
    var dots = 0i;
    var mins = 0i;
    for (var c = 0u; c < 4u; c++) {
        let sm1 = vec2<i32>(k_scale_min(s, 2u * c));
        let sm2 = vec2<i32>(k_scale_min(s, 2u * c + 1u));
        var s_lo = 0i;
        var s_hi = 0i;
        for (var j = 0u; j < 2u; j++) {
            let xl = xv(16u * b + 4u * c + j);
            let xh = xv(16u * b + 4u * c + 2u + j);
            for (var i = 0u; i < 4u; i++) {
                let q = w[i0 + 12u + 8u * c + 4u * j + i];
                let h = w[i0 + 4u + 4u * j + i];
                let q_lo = (q & 0x0F0F0F0Fu) | (((h >> (2u * c)) & 0x01010101u) << 4u);
                let q_hi = ((q >> 4u) & 0x0F0F0F0Fu) | (((h >> (2u * c + 1u)) & 0x01010101u) << 4u);
                s_lo += dot4I8Packed(q_lo, xl[i]);
                s_hi += dot4I8Packed(q_hi, xh[i]);
            }
        }
        let sums = vec4<i32>(xm(5u * b + 1u + c));
        dots += sm1.x * s_lo + sm2.x * s_hi;
        mins += sm1.y * (sums.x + sums.y) + sm2.y * (sums.z + sums.w);
    }
    return xm(5u * b).x * (dm.x * f32(dots) - dm.y * f32(mins));
}

// TOKENS (include/pieces_i8.wgsl): piece p is sub-block p, nibbles as Q4_K's and bit p of the high-bit bytes
fn block_head(wb: u32) -> KHead {
    let i0 = wb >> 2u;
    let dm = unpack2x16float(w[i0]);
    return KHead(dm.x, dm.y, vec4<u32>(w[i0 + 1u], w[i0 + 2u], w[i0 + 3u], 0u));
}

fn piece_unpack(wb: u32, head: KHead, p: u32) -> WPiece {
    let i0 = wb >> 2u;
    let q0 = i0 + 12u + 8u * (p >> 1u);
    let sh = 4u * (p & 1u);
    var pc = WPiece(vec4<u32>(0u), vec4<u32>(0u), vec2<i32>(k_scale_min(head.s, p)));
    for (var i = 0u; i < 4u; i++) {
        pc.lo[i] = ((w[q0 + i] >> sh) & 0x0F0F0F0Fu) | (((w[i0 + 4u + i] >> p) & 0x01010101u) << 4u);
        pc.hi[i] = ((w[q0 + 4u + i] >> sh) & 0x0F0F0F0Fu) | (((w[i0 + 8u + i] >> p) & 0x01010101u) << 4u);
    }
    return pc;
}

fn piece_apply(pc: WPiece, xa: vec4<u32>, xb: vec4<u32>, sums: vec2<i32>) -> vec2<i32> {
    return vec2<i32>(pc.sc.x * (dot16(pc.lo, xa) + dot16(pc.hi, xb)), pc.sc.y * (sums.x + sums.y));
}

fn block_finish(head: KHead, s: vec2<i32>, dx: f32) -> f32 {
    return dx * (head.d * f32(s.x) - head.dmin * f32(s.y));
}
