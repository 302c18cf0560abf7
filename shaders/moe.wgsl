// The elementwise ends of a mixture of experts, over rows of `width` values (a multiple of 4):
// EXPERT_SUM  y[t] = sum over slots j (in order) of weights[t, j] * x[t * used + j]: the experts' outputs
//             weighted by the router and added as llama.cpp adds them (one slot after another);
// SIGMOID_GATE y[t] = x[t] * sigmoid(g[t]): Qwen2-MoE's gate on its shared expert.
// Defines: WG and one of the two.
struct Params {
    n: u32,             // tokens
    width: u32,
    used: u32,          // experts per token (EXPERT_SUM)
    x_off: u32,         // element offsets
    g_off: u32,         // of the weights (EXPERT_SUM, row stride `used`) or the gates (SIGMOID_GATE, one per row)
    y_off: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    let w4 = params.width / 4u;
    if (i >= w4 || t >= params.n) {
        return;
    }
#ifdef EXPERT_SUM
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < params.used; j++) {
        let pair = t * params.used + j;
        acc += x[params.x_off / 4u + pair * w4 + i] * g[params.g_off + pair];
    }
    y[params.y_off / 4u + t * w4 + i] = acc;
#endif
#ifdef SIGMOID_GATE
    let s = 1.0 / (1.0 + exp(-g[params.g_off + t]));
    y[params.y_off / 4u + t * w4 + i] = x[params.x_off / 4u + t * w4 + i] * s;
#endif
}
