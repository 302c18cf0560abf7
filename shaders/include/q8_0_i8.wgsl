// Q8_0 (see q8_0.wgsl) against Q8_0 activations: d_w * d_x * sum q*x.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn block_dot(wb: u32, b: u32) -> f32 {
    let d = w_f16(wb);
    let i0 = (wb + 2u) >> 2u;
    let sh = ((wb + 2u) & 3u) * 8u;
    let xa = xv(2u * b);
    let xb = xv(2u * b + 1u);
    var lo = w[i0];
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        s += dot4I8Packed(funnel(lo, hi, sh), xa[i]);
        lo = hi;
    }
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 5u];
        s += dot4I8Packed(funnel(lo, hi, sh), xb[i]);
        lo = hi;
    }
    return d * xm(b).x * f32(s);
}
