// Q4_0, 18 B: d f16 | qs[16]; element j = low nibble of qs[j], j+16 = high nibble; x = d*(q-8).
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let d = w_f16(wb);
    // qs starts 2 bytes into a word half the time: slide a two-word window over it (5 loads, not 8)
    let i0 = (wb + 2u) >> 2u;
    let sh = ((wb + 2u) & 3u) * 8u;
    var lo = w[i0];
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        let q = funnel(lo, hi, sh);
        sink(d * (nib_lo(q) - 8.0), base + 4u * i, acc);
        sink(d * (nib_hi(q) - 8.0), base + 16u + 4u * i, acc);
        lo = hi;
    }
}
