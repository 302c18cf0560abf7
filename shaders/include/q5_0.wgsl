// Q5_0, 22 B: d f16 | qh u32 (bit j = 5th bit of element j) | qs[16] (as Q4_0); x = d*(q-16).
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let d = w_f16(wb);
    // qh and qs start 2 bytes into a word half the time: slide a two-word window over them (6 loads)
    let i0 = (wb + 2u) >> 2u;
    let sh = ((wb + 2u) & 3u) * 8u;
    var lo = w[i0 + 1u];
    let qh = funnel(w[i0], lo, sh);
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 2u];
        let q = funnel(lo, hi, sh);
        // the 5-bit values, one per byte: nibble | (its qh bit << 4), built in scalar registers
        let q_lo = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4u * i)) << 4u);
        let q_hi = ((q >> 4u) & 0x0F0F0F0Fu) | (spread4(qh >> (16u + 4u * i)) << 4u);
        sink(d * (u8x4(q_lo) - 16.0), base + 4u * i, acc);
        sink(d * (u8x4(q_hi) - 16.0), base + 16u + 4u * i, acc);
        lo = hi;
    }
}
