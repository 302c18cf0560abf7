// F16 "blocks" of 8 elements (16 bytes), unpacked to f32 (no shader-f16 needed).
const BLOCK_ELEMS: u32 = 8u;
const BLOCK_BYTES: u32 = 16u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i = wb >> 2u;
    sink(vec4<f32>(unpack2x16float(w[i]), unpack2x16float(w[i + 1u])), base, acc);
    sink(vec4<f32>(unpack2x16float(w[i + 2u]), unpack2x16float(w[i + 3u])), base + 4u, acc);
}
