// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w  for rows r (tokens, or tokens x heads for q/k
// norms). Vec4 loads: d is a multiple of 4. Defines: WG; REDUCE: one workgroup per row (real GPUs), its
// sum of squares by a shared-memory tree, or by subgroupAdd with SUBGROUP as well. RESIDUAL: y = r + the
// norm (rows of r at r_off, like x's): a post-norm that ends in the skip connection (gemma3), one pass.
#ifdef SUBGROUP
#enable subgroups
#endif
struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    x_off: u32,         // element offsets (multiples of 4)
    y_off: u32,
    w_off: u32,
    r_off: u32,         // RESIDUAL: element offset of row 0 of r (multiple of 4)
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;
#ifdef RESIDUAL
@group(0) @binding(2) var<storage, read> res: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> params: Params;
#else
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;
#endif

// element vec4 i of row r's output: the normed value (plus the residual's)
fn normed(r: u32, i: u32, v: vec4<f32>) -> vec4<f32> {
#ifdef RESIDUAL
    return res[(params.r_off + r * params.d) / 4u + i] + v;
#else
    return v;
#endif
}

#ifndef REDUCE
// One invocation per row (CPU adapters: no barrier). Grid: x = rows / WG.
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
        y[yb + i] = normed(r, i, x[xb + i] * inv * w[wb + i]);
    }
}
#else
// One workgroup per row: invocation i takes vec4s i, i + WG, ... (a one-token step's norm is then
// d/4/WG loads deep instead of d/4). Grid: x * z = rows (z when x would pass 65535). WG: a power of 2.
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>
#ifdef SUBGROUP
        , @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32
#endif
        ) {
    let r = wid.x + wid.z * nwg.x;
    if (r >= params.rows) {
        return;
    }
    let n4 = params.d / 4u;
    let xb = (params.x_off + r * params.d) / 4u;
    var ss = vec4<f32>(0.0);
    for (var i = lid.x; i < n4; i += WG) {
        let v = x[xb + i];
        ss = fma(v, v, ss);
    }
#ifdef SUBGROUP
    // one slot per subgroup (any subgroup size), then every invocation adds the n_sg slots
    let s = subgroupAdd(ss.x + ss.y + ss.z + ss.w);
    if (lane == 0u) {
        partial[sg] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < n_sg; i++) {
        total += partial[i];
    }
#else
    partial[lid.x] = ss.x + ss.y + ss.z + ss.w;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid.x < stride) {
            partial[lid.x] += partial[lid.x + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
#endif
    let inv = inverseSqrt(total / f32(params.d) + params.eps);
    let yb = (params.y_off + r * params.d) / 4u;
    let wb = params.w_off / 4u;
    for (var i = lid.x; i < n4; i += WG) {
        y[yb + i] = normed(r, i, x[xb + i] * inv * w[wb + i]);
    }
}
#endif
