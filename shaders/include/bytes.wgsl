// Reading GGUF blocks straight from a `w: array<u32>` binding (declared by the including family; with
// W_VEC4 it is an array<vec4<u32>> of repacked blocks, and w_f16 is left out).
// Blocks of 18, 22, 34 and 210 bytes (Q4_0, Q5_0, Q8_0, Q6_K) start 2 bytes into a word every other
// block, so their 32-bit fields straddle two words. The decoders slide a two-word window along each
// field (one new load per word) and `funnel` the word out. Measured on lavapipe (8192x2048 matvec,
// process CPU time): this costs the same as reading perfectly aligned blocks (Q8_0 11.7 vs 11.0 ms,
// Q6_K 17.7 vs 17.8), while joining two fresh loads per word cost 13-51% more (Q8_0 16.6 ms). So the
// weights are not repacked at load: they stay byte-identical to the file and go straight to the GPU.

// The word starting `sh` (0, 8, 16 or 24) bits into lo, continuing into hi.
fn funnel(lo: u32, hi: u32, sh: u32) -> u32 {
    return select((lo >> sh) | (hi << (32u - sh)), lo, sh == 0u);
}

#ifndef W_VEC4
// An f16 at an even byte offset, as f32 (unpack2x16float: no shader-f16 feature needed).
fn w_f16(byte: u32) -> f32 {
    let word = w[byte >> 2u];
    return unpack2x16float(word >> ((byte & 2u) * 8u)).x;
}
#endif

// The 4 low nibbles of the 4 bytes of q (byte order), and the 4 high nibbles.
fn nib_lo(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
}

fn nib_hi(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
}

// The 4 bytes of q as unsigned values.
fn u8x4(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
}

// Bits 0..3 of b moved to bits 0, 8, 16, 24 (one bit per byte): b * (1 + 2^7 + 2^14 + 2^21) puts bit j
// at bit 8j among stray copies that the mask clears.
fn spread4(b: u32) -> u32 {
    return ((b & 15u) * 0x00204081u) & 0x01010101u;
}

// The 4 bytes of q as signed int8 values.
fn i8x4(q: u32) -> vec4<f32> {
    let s = bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(s >> vec4<u32>(24u));
}

// Byte k (0..15) of four little-endian words.
fn byte_of(words: vec4<u32>, k: u32) -> u32 {
    return (words[k >> 2u] >> ((k & 3u) * 8u)) & 255u;
}
