// Q4_K (see q4_k.wgsl) against Q8_K activations: per 32-value sub-block j with 6-bit scale sc_j and min
// m_j, d_x * (d * sum_j sc_j * (q.x)_j - dmin * sum_j m_j * (sum x)_j), the sums in integers.
#include "include/kscales.wgsl"
#include "include/pieces_i8.wgsl"
#define PIECES 8u
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

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
            let xl = xv(16u * b + 4u * c + j);           // elements 64c + 16j ..: low nibbles
            let xh = xv(16u * b + 4u * c + 2u + j);      // 64c + 32 + 16j ..: high nibbles
            for (var i = 0u; i < 4u; i++) {
                let q = w[i0 + 4u + 8u * c + 4u * j + i];
                s_lo += dot4I8Packed(q & 0x0F0F0F0Fu, xl[i]);
                s_hi += dot4I8Packed((q >> 4u) & 0x0F0F0F0Fu, xh[i]);
            }
        }
        let sums = vec4<i32>(xm(5u * b + 1u + c));        // sums of 16: sub-block 2c is .x + .y
        dots += sm1.x * s_lo + sm2.x * s_hi;
        mins += sm1.y * (sums.x + sums.y) + sm2.y * (sums.z + sums.w);
    }
    return xm(5u * b).x * (dm.x * f32(dots) - dm.y * f32(mins));
}

// TOKENS (include/pieces_i8.wgsl): piece p is sub-block p, the low (even p) or high nibbles of 32 bytes
fn block_head(wb: u32) -> KHead {
    let i0 = wb >> 2u;
    let dm = unpack2x16float(w[i0]);
    return KHead(dm.x, dm.y, vec4<u32>(w[i0 + 1u], w[i0 + 2u], w[i0 + 3u], 0u));
}

fn piece_unpack(wb: u32, head: KHead, p: u32) -> WPiece {
    let q0 = (wb >> 2u) + 4u + 8u * (p >> 1u);
    let sh = 4u * (p & 1u);
    var pc = WPiece(vec4<u32>(0u), vec4<u32>(0u), vec2<i32>(k_scale_min(head.s, p)));
    for (var i = 0u; i < 4u; i++) {
        pc.lo[i] = (w[q0 + i] >> sh) & 0x0F0F0F0Fu;
        pc.hi[i] = (w[q0 + 4u + i] >> sh) & 0x0F0F0F0Fu;
    }
    return pc;
}

// sums: the token's two sums of 16 over the piece's elements
fn piece_apply(pc: WPiece, xa: vec4<u32>, xb: vec4<u32>, sums: vec2<i32>) -> vec2<i32> {
    return vec2<i32>(pc.sc.x * (dot16(pc.lo, xa) + dot16(pc.hi, xb)), pc.sc.y * (sums.x + sums.y));
}

fn block_finish(head: KHead, s: vec2<i32>, dx: f32) -> f32 {
    return dx * (head.d * f32(s.x) - head.dmin * f32(s.y));
}
