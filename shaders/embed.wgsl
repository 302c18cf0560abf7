// out[t, :] = row tokens[t] of the table W [vocab, d] (GGUF blocks, dequantized). One invocation per
// (block of the row, token). Defines: one W_<type>, WG, optional ROW_GROUP (include/row_group.wgsl).
#include "include/wtype.wgsl"
#include "include/row_group.wgsl"

struct Params {
    d: u32,             // row length (a multiple of BLOCK_ELEMS)
    n: u32,             // tokens
    row_bytes: u32,
    w_off: u32,         // bytes (multiple of 4)
    tok_off: u32,       // index of the first token in `tokens`
    out_off: u32,       // element offset (multiple of 4)
    row0: u32,          // this buffer holds table rows [row0, row0 + rows) (tables past the binding limit are split)
    rows: u32,
}

#ifdef W_VEC4
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(0) var<storage, read> w: array<u32>;
#endif
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

alias Acc = vec4<f32>;      // unused here: the decoders' accumulator type

fn sink(v: vec4<f32>, i: u32, acc: ptr<function, Acc>) {
    out[i >> 2u] = v;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let t = gid.y;
    if (b >= params.d / BLOCK_ELEMS || t >= params.n) {
        return;
    }
    let id = tokens[params.tok_off + t];
    if (id < params.row0 || id >= params.row0 + params.rows) {
        return;
    }
    var unused = vec4<f32>(0.0);
    block_apply(params.w_off + row_start(id - params.row0) + b * BLOCK_STEP, params.out_off + t * params.d + b * BLOCK_ELEMS, &unused);
}
