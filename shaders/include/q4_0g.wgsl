// Q4_0 in groups of 8 blocks (repack.wgsl's layout, `w: array<vec4<u32>>`, include/q4_0g_at.wgsl);
// x = d*(q-8). Callers pass the byte offset the block has in the file layout (18 per block): its index is
// that over 18.
#include "include/q4_0g_at.wgsl"
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i = wb / BLOCK_BYTES;
    let d = q4g_scale(i);
    let q = q4g_quants(i);
    for (var c = 0u; c < 4u; c++) {
        sink(d * (nib_lo(q[c]) - 8.0), base + 4u * c, acc);
        sink(d * (nib_hi(q[c]) - 8.0), base + 16u + 4u * c, acc);
    }
}
