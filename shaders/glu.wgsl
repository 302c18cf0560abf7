// out = act(gate) * up, elementwise over n rows of f (rows may be strided: fused gate/up tensors).
// One invocation per (vec4 of a row, row). Defines: WG and include/act.wgsl's (ACT_SILU or ACT_GELU,
// GELU_F16; F16).
#ifdef F16
#enable f16
#endif
#include "include/act.wgsl"

struct Params {
    n: u32,
    f: u32,             // row length (multiple of 4)
    gate_off: u32,      // element offsets and row strides (multiples of 4)
    gate_stride: u32,
    up_off: u32,
    up_stride: u32,
    out_off: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> gate: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> up: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= params.f / 4u || t >= params.n) {
        return;
    }
    let g = gate[(params.gate_off + t * params.gate_stride) / 4u + i];
    let u = up[(params.up_off + t * params.up_stride) / 4u + i];
    out[(params.out_off + t * params.f) / 4u + i] = act4(g) * u;
}
