// Store this step's keys and values in the layer's cache ring: k [n, kv_heads*head_dim] into
// kc[positions[t] % cap], v likewise. One invocation per (vec4 of the longer row, token); with a block
// type (KV_Q8, KV_Q4), per (block of 32 values of the longer row, token), which quantizes its block.
// Defines: WG; KV_F16, KV_Q8 or KV_Q4 for the cache's type (include/kv.wgsl).
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

#ifndef KV_BLOCKED
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
#endif

#ifdef KV_BLOCKED
// Block b of 32 values starting at vec4 `src` -> KV_WORDS words at `dst` of kc (is_k) or vc.
fn load_block(src: u32, is_k: bool) -> array<vec4<f32>, 8> {
    var x: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (is_k) {
            x[j] = k[src + j];
        } else {
            x[j] = v[src + j];
        }
    }
    return x;
}

fn store_word(dst: u32, w: u32, is_k: bool) {
    if (is_k) {
        kc[dst] = w;
    } else {
        vc[dst] = w;
    }
}
#endif

#ifdef KV_Q8
fn quantize_block(src: u32, dst: u32, is_k: bool) {
    let x = load_block(src, is_k);
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
        let a = abs(x[j]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    let d = amax / 127.0;
    var inv = 0.0;
    if (d > 0.0) {
        inv = 1.0 / d;
    }
    for (var j = 0u; j < 8u; j++) {
        store_word(dst + j, q8_pack(vec4<i32>(clamp(round(x[j] * inv), vec4<f32>(-127.0), vec4<f32>(127.0)))), is_k);
    }
    store_word(dst + 8u, bitcast<u32>(d), is_k);
}
#endif

#ifdef KV_Q4
fn quantize_block(src: u32, dst: u32, is_k: bool) {
    let x = load_block(src, is_k);
    // the value of largest magnitude, the first of equals (as llama.cpp's quantize_row_q4_0)
    var amax = 0.0;
    var m = 0.0;
    for (var j = 0u; j < 8u; j++) {
        for (var c = 0u; c < 4u; c++) {
            if (abs(x[j][c]) > amax) {
                amax = abs(x[j][c]);
                m = x[j][c];
            }
        }
    }
    let d = m / -8.0;
    var inv = 0.0;
    if (d != 0.0) {
        inv = 1.0 / d;
    }
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var h = 0u; h < 2u; h++) {
            let q = vec4<u32>(clamp(floor(x[2u * w + h] * inv + vec4<f32>(8.5)), vec4<f32>(0.0), vec4<f32>(15.0)));
            word |= (q.x | (q.y << 4u) | (q.z << 8u) | (q.w << 12u)) << (16u * h);
        }
        store_word(dst + w, word, is_k);
    }
    store_word(dst + 4u, bitcast<u32>(d), is_k);
}
#endif

#ifdef KV_BLOCKED
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let t = gid.y;
    if (t >= params.n) {
        return;
    }
    let slot = positions[params.pos_off + t] % params.cap;
    let kb = params.k_row / 32u;
    let vb = params.v_row / 32u;
    if (b < kb) {
        quantize_block(params.k_off / 4u + t * (params.k_row / 4u) + b * 8u, (slot * kb + b) * KV_WORDS, true);
    }
    if (b < vb) {
        quantize_block(params.v_off / 4u + t * (params.v_row / 4u) + b * 8u, (slot * vb + b) * KV_WORDS, false);
    }
}
#endif
