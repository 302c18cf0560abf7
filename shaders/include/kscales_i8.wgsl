// Q4_K/Q5_K's 12 scale bytes (include/kscales.wgsl) as all 8 sub-blocks' scales and mins at once, four
// to a vec4<i32>: a handful of word operations and unpack4xU8 instead of k_scale_min's byte picking per
// sub-block (on SwiftShader the int8 matvec is bound by its arithmetic, the scales' share included).
// s: the scale words (bytes 4-15 of the block).
struct KScales {
    sc_a: vec4<i32>,    // scales of sub-blocks 0..3
    sc_b: vec4<i32>,    // 4..7
    m_a: vec4<i32>,     // mins of sub-blocks 0..3
    m_b: vec4<i32>,     // 4..7
}

fn k_scales(s: vec3<u32>) -> KScales {
    // sub-blocks 0-3: the low 6 bits of bytes j and j+4; 4-7: a nibble of byte j+4 with the top 2 bits of
    // bytes j-4 (scales) and j (mins) as bits 4-5 (each byte's bits 6-7 moved down within the word)
    return KScales(vec4<i32>(unpack4xU8(s.x & 0x3F3F3F3Fu)),
                   vec4<i32>(unpack4xU8((s.z & 0x0F0F0F0Fu) | ((s.x >> 2u) & 0x30303030u))),
                   vec4<i32>(unpack4xU8(s.y & 0x3F3F3F3Fu)),
                   vec4<i32>(unpack4xU8(((s.z >> 4u) & 0x0F0F0F0Fu) | ((s.y >> 2u) & 0x30303030u))));
}

// The activation sums of 32 of Q8_K block b's 8 sub-blocks (its sums of 16 added in pairs), four to a vec4
fn x_sums32(b: u32) -> array<vec4<i32>, 2> {
    let s0 = xm(5u * b + 1u);
    let s1 = xm(5u * b + 2u);
    let s2 = xm(5u * b + 3u);
    let s3 = xm(5u * b + 4u);
    return array<vec4<i32>, 2>(vec4<i32>(vec4<f32>(s0.xz, s1.xz) + vec4<f32>(s0.yw, s1.yw)),
                               vec4<i32>(vec4<f32>(s2.xz, s3.xz) + vec4<f32>(s2.yw, s3.yw)));
}
