// F32 "blocks" of 8 elements (32 bytes). The including family defines
// sink(v: vec4<f32>, i: u32, acc: ptr<function, Acc>) for elements i..i+3 of the row.
const BLOCK_ELEMS: u32 = 8u;
const BLOCK_BYTES: u32 = 32u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i = wb >> 2u;
    sink(bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u])), base, acc);
    sink(bitcast<vec4<f32>>(vec4<u32>(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u])), base + 4u, acc);
}
