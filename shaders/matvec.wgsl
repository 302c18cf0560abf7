// y[t, r] = sum_k W[r, k] * x[t, k] (+ bias[r]) with W in its GGUF blocks, dequantized on the fly.
// Barrier-free: one invocation computes one output row for one token (what CPU adapters like lavapipe
// and SwiftShader want). Grid: x = rows / WG, y = tokens. Defines: one W_<type>, WG, optional BIAS.
#include "include/wtype.wgsl"

struct Params {
    m: u32,             // output rows
    k: u32,             // input length (a multiple of BLOCK_ELEMS)
    n: u32,             // tokens
    row_bytes: u32,     // bytes of one weight row
    w_off: u32,         // byte offset of the tensor in `w` (multiple of 4)
    x_off: u32,         // element offsets (multiples of 4)
    y_off: u32,
    bias_off: u32,
    y_stride: u32,      // elements between tokens' rows of y (m, or the whole width when W is split by rows)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#ifdef BIAS
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
#endif

var<private> x_base: u32;   // element index of this token's x row

fn sink(v: vec4<f32>, i: u32, acc: ptr<function, vec4<f32>>) {
    *acc = fma(v, x[(x_base + i) >> 2u], *acc);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    let t = gid.y;
    if (row >= params.m || t >= params.n) {
        return;
    }
    x_base = params.x_off + t * params.k;
    var acc = vec4<f32>(0.0);
    let wb = params.w_off + row * params.row_bytes;
    let nb = params.k / BLOCK_ELEMS;
    for (var b = 0u; b < nb; b++) {
        block_apply(wb + b * BLOCK_BYTES, b * BLOCK_ELEMS, &acc);
    }
    var r = acc.x + acc.y + acc.z + acc.w;
#ifdef BIAS
    r += bias[params.bias_off + row];
#endif
    y[params.y_off + t * params.y_stride + row] = r;
}
