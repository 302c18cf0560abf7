// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w  for rows r (tokens, or tokens x heads for q/k
// norms). One invocation per row, vec4 loads: d is a multiple of 4. Defines: WG.
struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    x_off: u32,         // element offsets (multiples of 4)
    y_off: u32,
    w_off: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= params.rows) {
        return;
    }
    let n4 = params.d / 4u;
    let xb = (params.x_off + r * params.d) / 4u;
    var ss = vec4<f32>(0.0);
    for (var i = 0u; i < n4; i++) {
        let v = x[xb + i];
        ss = fma(v, v, ss);
    }
    let inv = inverseSqrt((ss.x + ss.y + ss.z + ss.w) / f32(params.d) + params.eps);
    let yb = (params.y_off + r * params.d) / 4u;
    let wb = params.w_off / 4u;
    for (var i = 0u; i < n4; i++) {
        y[yb + i] = x[xb + i] * inv * w[wb + i];
    }
}
