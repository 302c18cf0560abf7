// Block i of a part in repack.wgsl's grouped Q6_K layout (`w: array<vec4<u32>>`): group i/8 is 105 vec4s,
// the 8 blocks' ql (8 vec4s each), then their qh (4 each, from vec4 64), their scales (1 each, from 96)
// and their 8 f16 d (vec4 104).
fn q6g_ql(i: u32, v: u32) -> vec4<u32> {            // ql bytes 16v..16v+15
    return w[(i >> 3u) * 105u + 8u * (i & 7u) + v];
}

fn q6g_qh(i: u32, v: u32) -> vec4<u32> {            // qh bytes 16v..16v+15
    return w[(i >> 3u) * 105u + 64u + 4u * (i & 7u) + v];
}

fn q6g_scales(i: u32) -> vec4<u32> {
    return w[(i >> 3u) * 105u + 96u + (i & 7u)];
}

fn q6g_d(i: u32) -> f32 {
    let j = i & 7u;
    return unpack2x16float(w[(i >> 3u) * 105u + 104u][j >> 1u] >> ((j & 1u) * 16u)).x;
}

// The 6-bit values of 16 elements, one per byte: the low (nib 0) or high (nib 4) nibbles of 16 ql bytes
// with bits 2q, 2q + 1 of 16 qh bytes as their top bits.
fn q6g_values(ql: vec4<u32>, qh: vec4<u32>, nib: u32, q: u32) -> vec4<u32> {
    return ((ql >> vec4<u32>(nib)) & vec4<u32>(0x0F0F0F0Fu)) | (((qh >> vec4<u32>(2u * q)) & vec4<u32>(0x03030303u)) << vec4<u32>(4u));
}
