// Elementwise over count vec4s (sizes are multiples of 4): OP_ADD y = a + b, OP_SCALE y = a * s,
// OP_SOFTCAP y = s * tanh(a / s), OP_COPY y = a (strided rows: splitting fused tensors when n > 1).
// Rows: element (t, i) of an operand is at off + t * stride + i. Defines: WG and one OP_*.
struct Params {
    n: u32,             // rows
    width: u32,         // elements per row (multiple of 4)
    a_off: u32,
    a_stride: u32,
    b_off: u32,
    b_stride: u32,
    y_off: u32,
    s: f32,
}

@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
#ifdef OP_ADD
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;
#else
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> params: Params;
#endif

#include "include/exact.wgsl"
const TANH_CLAMP: f32 = 15.0;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= params.width / 4u || t >= params.n) {
        return;
    }
    let av = a[(params.a_off + t * params.a_stride) / 4u + i];
#ifdef OP_ADD
    let r = av + b[(params.b_off + t * params.b_stride) / 4u + i];
#endif
#ifdef OP_SCALE
    let r = av * params.s;
#endif
#ifdef OP_SOFTCAP
    let r = params.s * tanh_exact(clamp(av / params.s, vec4<f32>(-TANH_CLAMP), vec4<f32>(TANH_CLAMP)));
#endif
#ifdef OP_COPY
    let r = av;
#endif
    y[(params.y_off + t * params.width) / 4u + i] = r;
}
