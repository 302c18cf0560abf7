// Store this step's keys and values in the layer's cache pages: k [n, kv_heads*head_dim] into the slot of
// position positions[t] in token t's sequence (include/kv.wgsl kv_slot), v likewise: the tokens of a
// batched step may each be another sequence's. One invocation per (vec4 of the longer row, token); with a
// block type (KV_Q8, KV_Q4), per (block of 32 values of the longer row, token), which quantizes its block.
// Defines: WG; KV_F16, KV_Q8 or KV_Q4 for the cache's type (include/kv.wgsl). ROPE: the keys arrive
// before their rotary embedding, which is applied here as rope.wgsl applies it (theta, mscale, NEOX
// pairs), so the roped keys never make a trip through memory; K_NORM (with ROPE) also RMS-norms each key
// head first (qwen3's and gemma3's k norm), summing its squares as rmsnorm.wgsl does. The values each
// element gets are those of the unfused ops.
struct Params {
    n: u32,
    k_row: u32,         // kv_heads * head_dim (multiple of 4)
    v_row: u32,         // kv_heads * head_dim_v
    table_len: u32,     // pages in a sequence's row of the page table (include/kv.wgsl kv_slot)
    pos_off: u32,
    k_off: u32,         // element offsets of this step's k and v (multiples of 4)
    v_off: u32,
    head_dim: u32,      // ROPE: of the keys
    dims: u32,          // ROPE: rotated dims of a head (even, <= head_dim)
    mscale: f32,        // ROPE
    eps: f32,           // K_NORM
    seq_off: u32,       // word offsets in the step map (`positions`) of each token's sequence
    table_off: u32,     // and of the layer's page table
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

#include "include/kv.wgsl"

@group(0) @binding(0) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
#ifdef ROPE
@group(0) @binding(3) var<storage, read> theta: array<f32>;
#ifdef K_NORM
@group(0) @binding(4) var<storage, read> k_norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> kc: array<KVCell>;
@group(0) @binding(6) var<storage, read_write> vc: array<KVCell>;
@group(0) @binding(7) var<uniform> params: Params;
#else
@group(0) @binding(4) var<storage, read_write> kc: array<KVCell>;
@group(0) @binding(5) var<storage, read_write> vc: array<KVCell>;
@group(0) @binding(6) var<uniform> params: Params;
#endif
#else
@group(0) @binding(3) var<storage, read_write> kc: array<KVCell>;
@group(0) @binding(4) var<storage, read_write> vc: array<KVCell>;
@group(0) @binding(5) var<uniform> params: Params;
#endif

#ifdef ROPE
#include "include/rope_angle.wgsl"

var<private> head_inv: f32;     // K_NORM: 1 / rms of the head being written

// the head `h` of token t, as rmsnorm.wgsl norms a row: its inverse rms
fn head_rms_inv(t: u32, h: u32) -> f32 {
    var ss = vec4<f32>(0.0);
    let base = (params.k_off + t * params.k_row + h * params.head_dim) / 4u;
    for (var i = 0u; i < params.head_dim / 4u; i++) {
        let x = k[base + i];
        ss = fma(x, x, ss);
    }
    return inverseSqrt((ss.x + ss.y + ss.z + ss.w) / f32(params.head_dim) + params.eps);
}

// element e of token t's key row before the rotation (K_NORM: normed, as rmsnorm.wgsl computes it)
fn key_in(t: u32, e: u32) -> f32 {
    let i = params.k_off + t * params.k_row + e;
#ifdef K_NORM
    let d = e % params.head_dim;
    return (k[i / 4u] * head_inv * k_norm[d / 4u])[i % 4u];
#else
    return k[i / 4u][i % 4u];
#endif
}

// element e of token t's key row as rope.wgsl leaves it
fn key_at(t: u32, e: u32) -> f32 {
    let d = e % params.head_dim;
    let half = params.dims / 2u;
    if (d >= params.dims) {
        return key_in(t, e);
    }
#ifdef NEOX
    let p = select(d - half, d, d < half);
    let i0 = e - d + p;
    let i1 = i0 + half;
#else
    let p = d / 2u;
    let i0 = e - d + 2u * p;
    let i1 = i0 + 1u;
#endif
    let cs = rope_cs(positions[params.pos_off + t], p);
    let a = key_in(t, i0);
    let b = key_in(t, i1);
    return select(b * cs.x + a * cs.y, a * cs.x - b * cs.y, e == i0);
}
#endif

// vec4 j of token t's key row, as the cache stores it
fn key4_of(t: u32, j: u32) -> vec4<f32> {
#ifdef ROPE
#ifdef K_NORM
    head_inv = head_rms_inv(t, 4u * j / params.head_dim);
#endif
    let e = 4u * j;
    return vec4<f32>(key_at(t, e), key_at(t, e + 1u), key_at(t, e + 2u), key_at(t, e + 3u));
#else
    return k[params.k_off / 4u + t * (params.k_row / 4u) + j];
#endif
}

#ifndef KV_BLOCKED
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (t >= params.n) {
        return;
    }
    let slot = kv_slot(page_row(t), positions[params.pos_off + t]);
    let k4 = params.k_row / 4u;
    let v4 = params.v_row / 4u;
    if (i < k4) {
        kc[slot * k4 + i] = kv_pack(key4_of(t, i));
    }
    if (i < v4) {
        vc[slot * v4 + i] = kv_pack(v[params.v_off / 4u + t * v4 + i]);
    }
}
#endif

#ifdef KV_BLOCKED
// The block of 32 values from vec4 `first` of token t's key (is_k) or value row.
fn load_block(t: u32, first: u32, is_k: bool) -> array<vec4<f32>, 8> {
    var x: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (is_k) {
            x[j] = key4_of(t, first + j);
        } else {
            x[j] = v[params.v_off / 4u + t * (params.v_row / 4u) + first + j];
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
fn quantize_block(t: u32, first: u32, dst: u32, is_k: bool) {
    let x = load_block(t, first, is_k);
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
fn quantize_block(t: u32, first: u32, dst: u32, is_k: bool) {
    let x = load_block(t, first, is_k);
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
    let slot = kv_slot(page_row(t), positions[params.pos_off + t]);
    let kb = params.k_row / 32u;
    let vb = params.v_row / 32u;
    if (b < kb) {
        quantize_block(t, b * 8u, (slot * kb + b) * KV_WORDS, true);
    }
    if (b < vb) {
        quantize_block(t, b * 8u, (slot * vb + b) * KV_WORDS, false);
    }
}
#endif
