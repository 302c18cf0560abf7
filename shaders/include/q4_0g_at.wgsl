// Block i of a part in repack.wgsl's grouped Q4_0 layout (`w: array<vec4<u32>>`): group i/8 is 9 vec4s,
// the 8 blocks' 16 quant bytes (1 vec4 each), then their 8 f16 scales (1 vec4).
fn q4g_quants(i: u32) -> vec4<u32> {     // byte j: elements j (low nibble) and j + 16 (high)
    return w[(i >> 3u) * 9u + (i & 7u)];
}

fn q4g_scale(i: u32) -> f32 {
    let j = i & 7u;
    return unpack2x16float(w[(i >> 3u) * 9u + 8u][j >> 1u] >> ((j & 1u) * 16u)).x;
}
