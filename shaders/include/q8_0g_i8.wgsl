// Q8_0 in groups of 8 blocks (repack.wgsl's layout, `w: array<vec4<u32>>`) against Q8_0 activations:
// per block two vec4 loads of quants and one scale word. ROW_BLOCKS: matvec_i8 passes each row's first
// block index (its file-layout byte offset over BLOCK_BYTES) and gets block b of all ROWS rows at once.
#include "include/q8_0g_at.wgsl"
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;
#define ROW_BLOCKS

fn block_at(i: u32) -> WBlock {
    return WBlock(group_quants(i, 0u), group_quants(i, 1u), group_scale(i), 0.0, 0.0);
}

// wb: the block's file-layout byte offset (as TOKENS passes it)
fn block_unpack(wb: u32) -> WBlock {
    return block_at(wb / BLOCK_BYTES);
}

fn block_dots(b: u32, first: ptr<function, array<u32, ROWS>>, acc: ptr<function, array<f32, ROWS>>) {
    let xa = xv(2u * b);
    let xb = xv(2u * b + 1u);
    let dx = xm(b).x;
    for (var r = 0u; r < ROWS; r++) {
        let blk = block_at((*first)[r] + b);
        (*acc)[r] += blk.d * dx * f32(dot16(blk.lo, xa) + dot16(blk.hi, xb));
    }
}
