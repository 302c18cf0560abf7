// The gated feed-forward's activation, act(gate), four values at a time: glu.wgsl, and the matvecs' GLU
// epilogue (one code, so fused and unfused agree bit for bit). Defines: ACT_SILU or ACT_GELU (GELU-tanh);
// GELU_F16 with ACT_GELU: llama.cpp's CPU GELU (a table over f16 inputs holding f16 outputs; 0 or x
// outside (-10, 10)), part of the llama.cpp arithmetic the int8 route follows. F16 (shader-f16, the f32
// route only): the activation computed in halves (SiLU's exp(-g) overflows to inf below g = -11, and
// g / inf is the 0 it tends to). In f32, tanh and the f16 rounding are include/exact.wgsl's (a driver's
// own may be approximate).
#include "include/exact.wgsl"
// (abstract constants: they take the type of the expression, f16 or f32)
const GELU_COEF_A = 0.044715;
const SQRT_2_OVER_PI = 0.7978845608028654;
const TANH_CLAMP = 15.0;
const GELU_TABLE_LIMIT = 10.0;
#ifdef F16
alias ActV = vec4<f16>;
#else
alias ActV = vec4<f32>;
#endif

fn act4(g32: vec4<f32>) -> vec4<f32> {
    let g = ActV(g32);
#ifdef ACT_SILU
    return vec4<f32>(g / (1.0 + exp(-g)));
#endif
#ifdef ACT_GELU
#ifdef GELU_F16
    let x = round_f16_4(g);
#else
    let x = g;
#endif
    let inner = clamp(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x), ActV(-TANH_CLAMP), ActV(TANH_CLAMP));
#ifdef GELU_F16
    let table = round_f16_4(0.5 * x * (1.0 + tanh_exact(inner)));
    return select(select(table, g, g >= vec4<f32>(GELU_TABLE_LIMIT)), vec4<f32>(0.0), g <= vec4<f32>(-GELU_TABLE_LIMIT));
#else
#ifdef F16
    return vec4<f32>(0.5 * x * (1.0 + tanh(inner)));
#else
    return 0.5 * x * (1.0 + tanh_exact(inner));
#endif
#endif
#endif
}
