// Q6_K in groups of 8 blocks (repack.wgsl's layout, `w: array<vec4<u32>>`; see q6_k.wgsl for the values
// and include/q6_kg_at.wgsl for the layout). Callers pass the block's file-layout byte offset (210 a
// block): its index is that over 210.
#include "include/q6_kg_at.wgsl"
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i = wb / BLOCK_BYTES;
    let d = q6g_d(i);
    let sw = q6g_scales(i);
    for (var n = 0u; n < 2u; n++) {
        for (var g = 0u; g < 2u; g++) {
            // elements 128n + 16g + 32q .. for the four 2-bit fields q of the same qh bytes
            let a = q6g_ql(i, 4u * n + g);
            let b = q6g_ql(i, 4u * n + 2u + g);
            let h = q6g_qh(i, 2u * n + g);
            let v = array<vec4<u32>, 4>(q6g_values(a, h, 0u, 0u), q6g_values(b, h, 0u, 1u), q6g_values(a, h, 4u, 2u),
                                        q6g_values(b, h, 4u, 3u));
            for (var q = 0u; q < 4u; q++) {
                let sc = d * f32(bitcast<i32>(byte_of(sw, 8u * n + g + 2u * q) << 24u) >> 24u);
                for (var c = 0u; c < 4u; c++) {
                    sink(sc * (u8x4(v[q][c]) - 32.0), base + 128u * n + 32u * q + 16u * g + 4u * c, acc);
                }
            }
        }
    }
}
