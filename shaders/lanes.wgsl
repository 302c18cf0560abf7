// A step's int8 rows (quantize.wgsl) as token pairs for matvec_i8's LANES: for tokens 2p and 2p + 1,
// element e becomes one i32, x[2p][e] + 65536 * x[2p + 1][e] (the two tokens in its 16-bit halves), so
// one integer multiply by a weight serves both tokens: w * P = w*x0 + 65536 * w*x1, and a sum of up to 16
// such products (|w| <= 15, |x| <= 127: |w*x0| summed stays under 2^15) splits back into the two exact
// sums. On SwiftShader, whose dot4I8Packed costs about 27 integer multiply-adds, that halves the products
// of a step of several tokens (measured in matvec_i8.wgsl's LANES note).
// Output: pair p's row of k words at word pair_off + p * k of the same buffer, after the token rows. A
// last pair of an odd count has its first token twice (its second lane is never stored).
// Grid: x = k / 4 / WG, y = pairs. Defines: WG.
struct Params {
    k: u32,             // row length (a multiple of 4)
    n: u32,             // tokens
    row_words: u32,     // words per token row (quantize.wgsl's)
    pair_off: u32,      // word offset of pair 0's row (multiple of 4)
}

@group(0) @binding(0) var<storage, read_write> xq: array<u32>;
@group(0) @binding(1) var<uniform> params: Params;

// the 4 int8 values of a word, sign-extended (by shifts: unpack4xI8's twin unpack4xU8 ran slower on SwiftShader)
fn widen(v: u32) -> vec4<i32> {
    return vec4<i32>(vec4<u32>(v) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let j = gid.x;              // the word of 4 elements
    let p = wid.y;
    if (4u * j >= params.k || 2u * p >= params.n) {
        return;
    }
    let lo = widen(xq[2u * p * params.row_words + j]);
    let hi = widen(xq[min(2u * p + 1u, params.n - 1u) * params.row_words + j]);
    let pair = bitcast<vec4<u32>>(lo + (hi << vec4<u32>(16u)));
    let at = params.pair_off + p * params.k + 4u * j;
    xq[at] = pair.x;
    xq[at + 1u] = pair.y;
    xq[at + 2u] = pair.z;
    xq[at + 3u] = pair.w;
}
