// Q4_0 (see q4_0.wgsl) against Q8_0 activations: d_w * d_x * (sum q*x - 8 * sum x), q the raw nibbles.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn block_dot(wb: u32, b: u32) -> f32 {
    let d = w_f16(wb);
    let i0 = (wb + 2u) >> 2u;
    let sh = ((wb + 2u) & 3u) * 8u;
    let xa = xv(2u * b);            // elements 0..15: the low nibbles
    let xb = xv(2u * b + 1u);       // 16..31: the high nibbles
    var lo = w[i0];
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        let hi = w[i0 + i + 1u];
        let q = funnel(lo, hi, sh);
        s += dot4I8Packed(q & 0x0F0F0F0Fu, xa[i]) + dot4I8Packed((q >> 4u) & 0x0F0F0F0Fu, xb[i]);
        lo = hi;
    }
    let m = xm(b);
    return d * m.x * (f32(s) - 8.0 * m.z);
}
