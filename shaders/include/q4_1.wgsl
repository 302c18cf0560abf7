// Q4_1, 20 B: d f16 | m f16 | qs[16] (nibbles as Q4_0); x = d*q + m.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let dm = unpack2x16float(w[wb >> 2u]);
    for (var i = 0u; i < 4u; i++) {
        let q = w[(wb >> 2u) + 1u + i];
        sink(dm.x * nib_lo(q) + dm.y, base + 4u * i, acc);
        sink(dm.x * nib_hi(q) + dm.y, base + 16u + 4u * i, acc);
    }
}
