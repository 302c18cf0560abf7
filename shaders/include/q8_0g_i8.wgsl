// Q8_0 in groups of 8 blocks (repack.wgsl's layout, `w: array<vec4<u32>>`) against Q8_0 activations:
// per block two vec4 loads of quants and one scale word. ROW_BLOCKS: matvec_i8 passes each row's first
// block index (its file-layout byte offset over BLOCK_BYTES) and gets block b of all ROWS rows at once.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;
#define ROW_BLOCKS

#define UNPACK

// wb: the block's file-layout byte offset (TOKENS passes bytes)
fn block_unpack(wb: u32) -> WBlock {
    let i = wb / BLOCK_BYTES;
    let g = (i >> 3u) * 17u;
    let j = i & 7u;
    let d = unpack2x16float(w[g + 16u][j >> 1u] >> ((j & 1u) * 16u)).x;
    return WBlock(w[g + 2u * j], w[g + 2u * j + 1u], d, 0.0, 0.0);
}

fn block_dots(b: u32, first: ptr<function, array<u32, ROWS>>, acc: ptr<function, array<f32, ROWS>>) {
    let xa = xv(2u * b);
    let xb = xv(2u * b + 1u);
    let dx = xm(b).x;
    for (var r = 0u; r < ROWS; r++) {
        let i = (*first)[r] + b;
        let g = (i >> 3u) * 17u;
        let j = i & 7u;
        let s = dot16(w[g + 2u * j], xa) + dot16(w[g + 2u * j + 1u], xb);
        let d = unpack2x16float(w[g + 16u][j >> 1u] >> ((j & 1u) * 16u)).x;
        (*acc)[r] += d * dx * f32(s);
    }
}
