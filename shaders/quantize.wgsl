// Activations -> int8 blocks for the int8 matvec (matvec_i8.wgsl), rounded exactly as llama.cpp's CPU
// backend rounds them (its Q8_0/Q8_1 and Q8_K "vec_dot" types), so pyshim.reference's llama.cpp
// emulation is the oracle. One invocation per block of one token; no barriers.
// Output, per token a row of `row_words` u32 (params): k/4 words of int8 values packed 4 per word in
// element order, then per block a few words of f32 metadata (the matvec reads them as vec4s):
//   default (blocks of 32, Q8_0/Q8_1): vec4(d, s, sum, 0) with d = amax/127 rounded to f16 (Q8_0's
//     stored scale), sum = the int sum of the 32 values, s = d_f32 * sum rounded to f16 (Q8_1's);
//     values = round_half_even(x * 127/amax);
//   Q8_K (blocks of 256, for the k-quants): vec4(d, 0, 0, 0) then 16 int sums of 16 values (4 vec4s);
//     the value of largest magnitude (the first one) maps to -127: iscale = -127/max, d = 1/iscale,
//     values = min(127, round_half_even(iscale * x)).
// Defines: WG, optional Q8_K; NORM: x's rows are first RMS-normed by `w` (the norm before a matmul, in
// the same pass: each invocation sums its row's squares itself, exactly as rmsnorm.wgsl does, so the
// values and their rounding are the unfused ones). Grid: x = blocks / WG, y = tokens.
#include "include/quant_block.wgsl"

struct Params {
    k: u32,             // row length (a multiple of QBLOCK)
    n: u32,             // tokens
    x_off: u32,         // element offset of token 0 in x (multiple of 4)
    x_stride: u32,      // elements between tokens in x
    q_off: u32,         // word offset of token 0's row in q (multiple of 4)
    row_words: u32,     // words per token row in q: k/4 + (k/QBLOCK)*META_WORDS
    eps: f32,           // NORM
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
#ifdef NORM
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;
#else
@group(0) @binding(1) var<storage, read_write> xq: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;
#endif

var<private> row_x0: u32;       // first vec4 of the token's row
var<private> inv_rms: f32;      // NORM: 1 / rms of the row

// vec4 i of the token's row, as the matmul takes it (NORM: normed and scaled by w)
fn xv(i: u32) -> vec4<f32> {
#ifdef NORM
    return x[row_x0 + i] * inv_rms * w[i];
#else
    return x[row_x0 + i];
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let b = gid.x;
    let t = wid.y;
    let nb = params.k / QBLOCK;
    if (b >= nb || t >= params.n) {
        return;
    }
    row_x0 = (params.x_off + t * params.x_stride) >> 2u;
    let x0 = b * QBLOCK / 4u;                                                 // the block's first vec4 in the row
#ifdef NORM
    var ss = vec4<f32>(0.0);
    for (var i = 0u; i < params.k / 4u; i++) {
        let v = x[row_x0 + i];
        ss = fma(v, v, ss);
    }
    inv_rms = inverseSqrt((ss.x + ss.y + ss.z + ss.w) / f32(params.k) + params.eps);
#endif
    let row = params.q_off + t * params.row_words;
    var v: array<vec4<f32>, QVEC4>;
    for (var i = 0u; i < QVEC4; i++) {
        v[i] = xv(x0 + i);
    }
    quant_block(&v, row + b * QVEC4, row + params.k / 4u + b * META_WORDS);
}
