// Block i of a part in repack.wgsl's grouped Q8_0 layout (`w: array<vec4<u32>>`): group i/8 is 17 vec4s,
// the 8 blocks' quants (2 vec4s each), then their 8 f16 scales (1 vec4).
fn group_quants(i: u32, h: u32) -> vec4<u32> {      // h = 0: elements 0..15, 1: 16..31
    return w[(i >> 3u) * 17u + 2u * (i & 7u) + h];
}

fn group_scale(i: u32) -> f32 {
    let j = i & 7u;
    return unpack2x16float(w[(i >> 3u) * 17u + 16u][j >> 1u] >> ((j & 1u) * 16u)).x;
}
