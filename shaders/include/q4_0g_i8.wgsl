// Q4_0 in groups of 8 blocks (repack.wgsl's layout, include/q4_0g_at.wgsl) against Q8_0 activations: per
// block one vec4 of quants and a scale, d_w * d_x * (sum q*x - 8 * sum x), q the raw nibbles. Why grouped:
// the file's 18-byte blocks start 2 bytes into a word every other block, so each quant word is pieced
// from two loads; on CPU adapters, where an invocation's load is a gather and the matvec is bound by
// instructions, whole vec4s cost less. Block b of all ROWS rows at once (include/row_blocks_i8.wgsl).
#include "include/q4_0g_at.wgsl"
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_at(i: u32) -> WBlock {
    let q = q4g_quants(i);
    return WBlock(q & vec4<u32>(0x0F0F0F0Fu), (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu), q4g_scale(i), 8.0, 0.0);
}

#include "include/row_blocks_i8.wgsl"
