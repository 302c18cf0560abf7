// Q8_0 in groups of 8 blocks (repack.wgsl's layout, `w: array<vec4<u32>>`); x = d*q. Callers pass the
// byte offset the block has in the file layout (34 per block): its index is that over 34.
#include "include/q8_0g_at.wgsl"
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i = wb / BLOCK_BYTES;
    let d = group_scale(i);
    for (var h = 0u; h < 2u; h++) {
        let q = group_quants(i, h);
        for (var c = 0u; c < 4u; c++) {
            sink(d * i8x4(q[c]), base + 16u * h + 4u * c, acc);
        }
    }
}
