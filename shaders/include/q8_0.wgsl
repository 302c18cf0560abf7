// Q8_0, 34 B: d f16 | qs[32] int8; x = d*q.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let d = w_f16(wb);
    // qs starts 2 bytes into a word half the time: slide a two-word window over it (9 loads, not 16)
    let i0 = (wb + 2u) >> 2u;
    let sh = ((wb + 2u) & 3u) * 8u;
    var lo = w[i0];
    for (var i = 0u; i < 8u; i++) {
        let hi = w[i0 + i + 1u];
        sink(d * i8x4(funnel(lo, hi, sh)), base + 4u * i, acc);
        lo = hi;
    }
}
