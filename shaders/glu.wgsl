// out = act(gate) * up, elementwise over n rows of f (rows may be strided: fused gate/up tensors).
// One invocation per (vec4 of a row, row). Defines: WG, ACT_SILU or ACT_GELU (GELU-tanh); GELU_F16 with
// ACT_GELU: llama.cpp's CPU GELU (a table over f16 inputs holding f16 outputs; 0 or x outside (-10, 10)),
// part of the llama.cpp arithmetic the int8 route follows.
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

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.7978845608028654;
const TANH_CLAMP: f32 = 15.0;
const GELU_TABLE_LIMIT: f32 = 10.0;

// f32 -> nearest f16 -> f32 (pack2x16float: no shader-f16 needed)
fn f16_round(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(pack2x16float(v.xy)), unpack2x16float(pack2x16float(v.zw)));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= params.f / 4u || t >= params.n) {
        return;
    }
    let g = gate[(params.gate_off + t * params.gate_stride) / 4u + i];
    let u = up[(params.up_off + t * params.up_stride) / 4u + i];
#ifdef ACT_SILU
    let a = g / (1.0 + exp(-g));
#endif
#ifdef ACT_GELU
#ifdef GELU_F16
    let x = f16_round(g);
#else
    let x = g;
#endif
    let inner = clamp(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x), vec4<f32>(-TANH_CLAMP), vec4<f32>(TANH_CLAMP));
#ifdef GELU_F16
    let table = f16_round(0.5 * x * (1.0 + tanh(inner)));
    let a = select(select(table, g, g >= vec4<f32>(GELU_TABLE_LIMIT)), vec4<f32>(0.0), g <= vec4<f32>(-GELU_TABLE_LIMIT));
#else
    let a = 0.5 * x * (1.0 + tanh(inner));
#endif
#endif
    out[(params.out_off + t * params.f) / 4u + i] = a * u;
}
