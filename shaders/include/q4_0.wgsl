// Q4_0, 18 B: d f16 | qs[16]; element j = low nibble of qs[j], j+16 = high nibble; x = d*(q-8).
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let d = w_f16(wb);
    for (var i = 0u; i < 4u; i++) {
        let q = w_u32(wb + 2u + 4u * i);
        sink(d * (nib_lo(q) - 8.0), base + 4u * i, acc);
        sink(d * (nib_hi(q) - 8.0), base + 16u + 4u * i, acc);
    }
}
