// Q5_K, 176 B: d f16 | dmin f16 | scales[12] (as Q4_K) | qh[32] | qs[128] (as Q4_K). The 5th bit of
// element 64c+l is bit 2c of qh[l], of element 64c+32+l bit 2c+1; x = d*sc*q - dmin*m.
#include "include/kscales.wgsl"
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i0 = wb >> 2u;                      // 176 is a multiple of 4: this block is word-aligned
    let dm = unpack2x16float(w[i0]);
    let s = vec4<u32>(w[i0 + 1u], w[i0 + 2u], w[i0 + 3u], 0u);
    for (var c = 0u; c < 4u; c++) {
        let sm1 = k_scale_min(s, 2u * c);
        let sm2 = k_scale_min(s, 2u * c + 1u);
        let d1 = dm.x * sm1.x;
        let m1 = dm.y * sm1.y;
        let d2 = dm.x * sm2.x;
        let m2 = dm.y * sm2.y;
        for (var i = 0u; i < 8u; i++) {
            let q = w[i0 + 12u + 8u * c + i];
            let h = w[i0 + 4u + i];
            // the 5-bit values, one per byte, built in scalar registers
            let q_lo = (q & 0x0F0F0F0Fu) | (((h >> (2u * c)) & 0x01010101u) << 4u);
            let q_hi = ((q >> 4u) & 0x0F0F0F0Fu) | (((h >> (2u * c + 1u)) & 0x01010101u) << 4u);
            sink(d1 * u8x4(q_lo) - m1, base + 64u * c + 4u * i, acc);
            sink(d2 * u8x4(q_hi) - m2, base + 64u * c + 32u + 4u * i, acc);
        }
    }
}
