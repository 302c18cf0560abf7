// Rounding and tanh computed exactly on any driver. A driver may fold unpack2x16float(pack2x16float(x))
// to x and its tanh may be approximate: NVIDIA's Vulkan driver on an H200 did both (its f16 "rounding" kept
// f32 values, its tanh was 5e-4 off), where SwiftShader and lavapipe compute them exactly. These use
// integer steps and exp only. (Its division may be 2.5 ulp off too, as WGSL allows; the int8 route's
// quantize, llama.cpp's rounding, divides, and is exact where that route is the default: CPU adapters.
// A correction by fma was tried and dropped: lavapipe's fma is not always fused.)

// x rounded to the nearest f16 (ties to even), as f32: f16's subnormals, overflow to inf and NaN included
fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let sign = bits & 0x80000000u;
    let a = bits & 0x7fffffffu;
    let e = a >> 23u;
    if (e == 255u) {
        return x;                                   // inf, NaN
    }
    if (e < 103u) {                                 // below 2^-24, f16's least subnormal: 0 or that subnormal
        return bitcast<f32>(sign | select(0u, 0x33800000u, a > 0x33000000u));
    }
    // bits below f16's last kept bit: 13 for normal f16 (exponent >= 2^-14: biased 113), more below it
    let drop = select(13u, 126u - e, e < 113u);
    let half = 1u << (drop - 1u);
    let rest = a & ((1u << drop) - 1u);
    var r = a - rest;
    if (rest > half || (rest == half && ((r >> drop) & 1u) == 1u)) {
        r += 1u << drop;                            // a carry into the exponent is the right result too
    }
    if (r >= 0x47800000u) {
        r = 0x7f800000u;                            // 65520 and above round to inf
    }
    return bitcast<f32>(sign | r);
}

fn round_f16_4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(round_f16(v.x), round_f16(v.y), round_f16(v.z), round_f16(v.w));
}

// tanh to a few ulp where a driver's tanh may be approximate: its series near 0 (where 1 - 2/(e^2x + 1)
// would lose x's digits), else from exp; callers clamp |x| <= 15 (tanh is 1 in f32 beyond 9)
fn tanh_exact(x: vec4<f32>) -> vec4<f32> {
    let x2 = x * x;
    let series = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
    let far = sign(x) * (1.0 - 2.0 / (exp(2.0 * abs(x)) + 1.0));
    return select(far, series, abs(x) < vec4<f32>(0.1));
}

fn tanh_exact1(x: f32) -> f32 {
    return tanh_exact(vec4<f32>(x)).x;
}
