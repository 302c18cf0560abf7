// Q8_0 in groups of 8 blocks (repack.wgsl's layout, `w: array<vec4<u32>>`) against Q8_0 activations:
// per block two vec4 loads of quants and one scale word; block b of all ROWS rows at once
// (include/row_blocks_i8.wgsl).
#include "include/q8_0g_at.wgsl"
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_at(i: u32) -> WBlock {
    return WBlock(group_quants(i, 0u), group_quants(i, 1u), group_scale(i), 0.0, 0.0);
}

#include "include/row_blocks_i8.wgsl"
