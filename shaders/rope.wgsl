// Rotary embedding of x [n, heads, head_dim] at positions[t]: pair p (< dims/2) turns by
// positions[t] * theta[p] (theta: per-pair angle per position, from pyshim.rope.pair_tables, with
// freq scaling, YaRN mix and frequency factors folded in), cos/sin scaled by mscale. NEOX pairs
// (p, p + dims/2), otherwise (2p, 2p+1). Dims past `dims` are copied. One invocation per
// (pair of head_dim/2, head, token). Defines: WG, optional NEOX; NORM: each head is RMS-normed by `w`
// first (qwen3's and gemma3's q norm), its squares summed as rmsnorm.wgsl sums a row's, in this pass.
// SCALE: each rotated head's element e is then multiplied by theta[scale_off + h * head_dim + e] (a q4/q8
// cache's key scales, pyshim.models.key_scales; kept after the angles so no binding is added).
// ROTATE (a q4 cache's keys and queries): one workgroup per (head, token) instead, the head gathered in
// workgroup memory and turned by a Hadamard matrix in groups of `rot` values — log2(rot) butterfly stages
// (a + b, a - b) over pairs `span` apart, span = 1, 2, 4, ..., then times `rnorm` (f32(1 / sqrt(rot))): the
// order of pyshim.models.key_scales.hadamard, so the reference's bits. Head dims up to 512.
struct Params {
    n: u32,             // tokens
    heads: u32,
    head_dim: u32,
    dims: u32,          // rotated dims (even, <= head_dim)
    mscale: f32,
    x_off: u32,         // element offsets (multiples of 4)
    y_off: u32,
    pos_off: u32,       // index of the first position in `positions`
    eps: f32,           // NORM
    scale_off: u32,     // SCALE: index in `theta` of head 0's first scale
    rot: u32,           // ROTATE: values per rotation (a power of two dividing head_dim)
    rnorm: f32,         // ROTATE: f32(1 / sqrt(rot))
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read> theta: array<f32>;
#ifdef NORM
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
#endif

#include "include/rope_angle.wgsl"

var<private> inv_rms: f32;      // NORM: 1 / rms of the head

// element e of head h as it leaves: y (SCALE: times its scale)
fn scaled(v: f32, h: u32, e: u32) -> f32 {
#ifdef SCALE
    return v * theta[params.scale_off + h * params.head_dim + e];
#else
    return v;
#endif
}

fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

// element d of the head starting at element `row` of x (NORM: normed, as rmsnorm.wgsl computes it)
fn head_at(row: u32, d: u32) -> f32 {
#ifdef NORM
    return (x4(row + d - d % 4u) * inv_rms * w[d / 4u])[d % 4u];
#else
    return x[row + d];
#endif
}

#ifdef NORM
// inv_rms of the head starting at element `xr` of x, its squares summed as rmsnorm.wgsl sums a row's
fn norm_head(xr: u32) {
    var ss = vec4<f32>(0.0);
    for (var i = 0u; i < params.head_dim; i += 4u) {
        let v = x4(xr + i);
        ss = fma(v, v, ss);
    }
    inv_rms = inverseSqrt((ss.x + ss.y + ss.z + ss.w) / f32(params.head_dim) + params.eps);
}
#endif

// pair p (< head_dim / 2) of head h of token t as it leaves: elements i0 and i1 and their values
struct PairOut {
    i0: u32,
    v0: f32,
    i1: u32,
    v1: f32,
}

fn pair_out(xr: u32, h: u32, t: u32, p: u32) -> PairOut {
    let half = params.dims / 2u;
    if (p >= half) {            // pass-through dims, two per pair
        let e = params.dims + 2u * (p - half);
        return PairOut(e, scaled(head_at(xr, e), h, e), e + 1u, scaled(head_at(xr, e + 1u), h, e + 1u));
    }
#ifdef NEOX
    let i0 = p;
    let i1 = p + half;
#else
    let i0 = 2u * p;
    let i1 = 2u * p + 1u;
#endif
    let cs = rope_cs(positions[params.pos_off + t], p);
    let a = head_at(xr, i0);
    let b = head_at(xr, i1);
    return PairOut(i0, scaled(a * cs.x - b * cs.y, h, i0), i1, scaled(b * cs.x + a * cs.y, h, i1));
}

#ifdef ROTATE
var<workgroup> hv: array<f32, 512>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.y;
    let t = wid.z;
    let row = (t * params.heads + h) * params.head_dim;
    let xr = params.x_off + row;
#ifdef NORM
    norm_head(xr);
#endif
    let pairs = params.head_dim / 2u;
    for (var p = lid; p < pairs; p += WG) {
        let o = pair_out(xr, h, t, p);
        hv[o.i0] = o.v0;
        hv[o.i1] = o.v1;
    }
    workgroupBarrier();
    let w = params.rot;
    for (var span = 1u; span < w; span *= 2u) {
        for (var i = lid; i < pairs; i += WG) {          // butterfly i: group i / (w / 2), its (i % (w / 2))th
            let j = i / (w / 2u) * w + i % (w / 2u) / span * 2u * span + i % span;
            let a = hv[j];
            let b = hv[j + span];
            hv[j] = a + b;
            hv[j + span] = a - b;
        }
        workgroupBarrier();
    }
    for (var e = lid; e < params.head_dim; e += WG) {
        y[params.y_off + row + e] = hv[e] * params.rnorm;
    }
}
#else
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = gid.x;
    let h = gid.y;
    let t = gid.z;
    if (p >= params.head_dim / 2u || h >= params.heads || t >= params.n) {
        return;
    }
    let row = (t * params.heads + h) * params.head_dim;
    let xr = params.x_off + row;
#ifdef NORM
    norm_head(xr);
#endif
    let o = pair_out(xr, h, t, p);
    y[params.y_off + row + o.i0] = o.v0;
    y[params.y_off + row + o.i1] = o.v1;
}
#endif
