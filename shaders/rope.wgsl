// Rotary embedding of x [n, heads, head_dim] at positions[t]: pair p (< dims/2) turns by
// positions[t] * theta[p] (theta: per-pair angle per position, from pyshim.rope.pair_tables, with
// freq scaling, YaRN mix and frequency factors folded in), cos/sin scaled by mscale. NEOX pairs
// (p, p + dims/2), otherwise (2p, 2p+1). Dims past `dims` are copied. One invocation per
// (pair of head_dim/2, head, token). Defines: WG, optional NEOX.
struct Params {
    n: u32,             // tokens
    heads: u32,
    head_dim: u32,
    dims: u32,          // rotated dims (even, <= head_dim)
    mscale: f32,
    x_off: u32,         // element offsets
    y_off: u32,
    pos_off: u32,       // index of the first position in `positions`
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read> theta: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let p = gid.x;
    let h = gid.y;
    let t = gid.z;
    if (p >= params.head_dim / 2u || h >= params.heads || t >= params.n) {
        return;
    }
    let row = (t * params.heads + h) * params.head_dim;
    let half = params.dims / 2u;
    if (p >= half) {            // pass-through dims, two per invocation
        let e = params.dims + 2u * (p - half);
        y[params.y_off + row + e] = x[params.x_off + row + e];
        y[params.y_off + row + e + 1u] = x[params.x_off + row + e + 1u];
        return;
    }
#ifdef NEOX
    let i0 = p;
    let i1 = p + half;
#else
    let i0 = 2u * p;
    let i1 = 2u * p + 1u;
#endif
    let angle = f32(positions[params.pos_off + t]) * theta[p];
    let c = cos(angle) * params.mscale;
    let s = sin(angle) * params.mscale;
    let a = x[params.x_off + row + i0];
    let b = x[params.x_off + row + i1];
    y[params.y_off + row + i0] = a * c - b * s;
    y[params.y_off + row + i1] = b * c + a * s;
}
