// Store this step's keys and values in the layer's cache ring: k [n, kv_heads*head_dim] into
// kc[positions[t] % cap], v likewise. One invocation per (vec4 of the longer row, token).
// Defines: WG; KV_F16 for a cache of halves (include/kv.wgsl).
struct Params {
    n: u32,
    k_row: u32,         // kv_heads * head_dim (multiple of 4)
    v_row: u32,         // kv_heads * head_dim_v
    cap: u32,
    pos_off: u32,
    k_off: u32,         // element offsets of this step's k and v (multiples of 4)
    v_off: u32,
    _pad0: u32,
}

#include "include/kv.wgsl"

@group(0) @binding(0) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read_write> kc: array<KVCell>;
@group(0) @binding(4) var<storage, read_write> vc: array<KVCell>;
@group(0) @binding(5) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (t >= params.n) {
        return;
    }
    let slot = positions[params.pos_off + t] % params.cap;
    let k4 = params.k_row / 4u;
    let v4 = params.v_row / 4u;
    if (i < k4) {
        kc[slot * k4 + i] = kv_pack(k[params.k_off / 4u + t * k4 + i]);
    }
    if (i < v4) {
        vc[slot * v4 + i] = kv_pack(v[params.v_off / 4u + t * v4 + i]);
    }
}
