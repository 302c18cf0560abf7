// The 12 scale bytes of Q4_K/Q5_K: 8 sub-blocks of 32 elements, each a 6-bit scale and a 6-bit min.
// Sub-blocks 0-3: low 6 bits of bytes j (scale) and j+4 (min); 4-7: a nibble of byte j+4 plus the top
// 2 bits of bytes j-4 (scale) and j (min). Returns (scale, min) as f32.
fn k_scale_min(s: vec4<u32>, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_of(s, j) & 63u), f32(byte_of(s, j + 4u) & 63u));
    }
    let b = byte_of(s, j + 4u);
    let sc = (b & 15u) | ((byte_of(s, j - 4u) >> 6u) << 4u);
    let m = (b >> 4u) | ((byte_of(s, j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
