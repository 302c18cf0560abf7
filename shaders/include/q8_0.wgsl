// Q8_0, 34 B: d f16 | qs[32] int8; x = d*q.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let d = w_f16(wb);
    for (var i = 0u; i < 8u; i++) {
        sink(d * i8x4(w_u32(wb + 2u + 4u * i)), base + 4u * i, acc);
    }
}
