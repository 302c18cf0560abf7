// Decode attention over the KV cache with an online softmax, one invocation per (query head, token,
// split of the key range): out[t, h, :] = softmax_j(softcap(scale * q[t,h]·k[j, h/G])) · v[j, h/G] over
// key positions j in [lo, positions[t]], lo = max(0, pos - window + 1) for sliding-window layers, else 0.
// Keys live in pages (include/kv.wgsl kv_slot): token t reads its own sequence's, so the tokens of a
// batched decode step may each be another sequence's; a sliding-window layer's row of pages is a ring
// of at least window + chunk - 1 positions (a chunk's own writes never evict a key its queries still need).
// The cache must already hold this step's keys (kv_write runs first). Barrier-free.
// SPLITS = 1: the invocation writes out[] itself. SPLITS > 1 (long contexts, real GPUs): split s covers
// its share of [lo, pos] and writes (max, sum, unnormalized output) to `partial`; the COMBINE variant
// (one invocation per head, token and vec4 of the output) merges the splits into out[].
// LANES (real GPUs): a workgroup of LANES invocations per (head, token, split), a head's dims across it.
// Defines: WG, HEAD_DIM/4 as HD4, HEAD_DIM_V/4 as HDV4, SPLITS, optional SOFTCAP, and KV_F16 or KV_Q8
// (the cache's type, include/kv.wgsl); COMBINE for pass 2. QUANT (SPLITS = 1, the int8 route): each head's
// output goes out rounded to the next matmul's int8 blocks (quantize.wgsl's layout and arithmetic, Q8_K
// for blocks of 256), so no quantize pass follows; a head must hold whole blocks. F16 (devices with shader-f16): the q·k products
// in f16 (an f16 cache read as halves), their sums, the softmax and the values in f32.
#ifdef F16
#enable f16
#endif
#include "include/attention_params.wgsl"

// one split's record in `partial`: vec4(max, sum, 0, 0), then HDV4 vec4s of the unnormalized output
const RECORD: u32 = HDV4 + 1u;
const SCORE_FLOOR: f32 = -3.0e38;   // the running max before any key (finite: exp() of differences stays defined)
const TANH_CLAMP: f32 = 15.0;       // tanh is 1 to f32 precision beyond this; clamping avoids inf/inf in exp-based tanh

#ifndef COMBINE
#include "include/kv.wgsl"
#include "include/exact.wgsl"

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<KVCell>;
@group(0) @binding(2) var<storage, read> vc: array<KVCell>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
#ifdef QUANT
#include "include/quant_block.wgsl"
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;
#else
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
#endif
@group(0) @binding(5) var<uniform> params: Params;

// the key positions [first, end) split `split` of token t attends to (its window's, in SPLITS shares)
fn key_span(t: u32, split: u32) -> vec2<u32> {
    let pos = positions[params.pos_off + t];
    var lo = 0u;
    if (params.window > 0u && pos + 1u > params.window) {
        lo = pos + 1u - params.window;
    }
    let share = (pos + 1u - lo + SPLITS - 1u) / SPLITS;       // keys per split
    let first = lo + split * share;
    return vec2<u32>(first, min(first + share, pos + 1u));
}

// a key's score (scaled) into the running softmax (max m, sum l): returns (corr, p), what the output so far
// is rescaled by and this key's value weighs
fn online(score: f32, m: ptr<function, f32>, l: ptr<function, f32>) -> vec2<f32> {
    var s = score;
#ifdef SOFTCAP
    s = params.softcap * tanh_exact1(clamp(s / params.softcap, -TANH_CLAMP, TANH_CLAMP));
#endif
    let m_new = max(*m, s);
    let corr = exp(*m - m_new);
    let p = exp(s - m_new);
    *l = *l * corr + p;
    *m = m_new;
    return vec2<f32>(corr, p);
}

#ifdef LANES
// A workgroup of LANES invocations per (head, token, split), the real-GPU form: lane i holds q's vec4s
// i, i + LANES, ... and the same of each value row, a key's score is their sum over the workgroup (a tree
// in workgroup memory), and every lane follows the same online softmax. One invocation walking the keys
// alone, as below, left an H200 latency-bound: 3 ms a token for 28 layers at a 9-token context.
const QPER: u32 = (HD4 + LANES - 1u) / LANES;      // q's and a key's vec4s a lane holds
const VPER: u32 = (HDV4 + LANES - 1u) / LANES;     // a value row's
var<workgroup> red: array<f32, LANES>;
var<workgroup> bounds: vec2<u32>;

@compute @workgroup_size(LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let h = wid.x;
    let t = wid.y;
    let split = wid.z;
    let kvh = h / (params.heads / params.kv_heads);
    if (lane == 0u) {
        bounds = key_span(t, split);
    }
    let span = workgroupUniformLoad(&bounds);       // (the loop below holds barriers: its bounds uniform)
    let prow = page_row(t);
    let qb = params.q_off / 4u + (t * params.heads + h) * HD4;
#ifdef F16
    var qv: array<vec4<f16>, QPER>;
#else
    var qv: array<vec4<f32>, QPER>;
#endif
    for (var c = 0u; c < QPER; c++) {
        let i = lane + c * LANES;
#ifdef F16
        qv[c] = vec4<f16>(select(vec4<f32>(0.0), q[qb + min(i, HD4 - 1u)], i < HD4));
#else
        qv[c] = select(vec4<f32>(0.0), q[qb + min(i, HD4 - 1u)], i < HD4);
#endif
    }
    var acc: array<vec4<f32>, VPER>;
    var m = SCORE_FLOOR;
    var l = 0.0;
    for (var j = span.x; j < span.y; j++) {
        let row = kv_slot(prow, j) * params.kv_heads + kvh;
        var dv = vec4<f32>(0.0);
        for (var c = 0u; c < QPER; c++) {
            let i = lane + c * LANES;
            if (i < HD4) {
#ifdef F16
                dv += vec4<f32>(qv[c] * key4h(row, i));
#else
                dv = fma(qv[c], key4(row, i), dv);
#endif
            }
        }
        red[lane] = dv.x + dv.y + dv.z + dv.w;
        for (var w = LANES / 2u; w > 0u; w >>= 1u) {
            workgroupBarrier();
            if (lane < w) {
                red[lane] += red[lane + w];
            }
        }
        let w = online(workgroupUniformLoad(&red[0]) * params.scale, &m, &l);
        workgroupBarrier();                         // every lane has read it before the next key's sums
        for (var c = 0u; c < VPER; c++) {
            let i = lane + c * LANES;
            if (i < HDV4) {
                acc[c] = fma(vec4<f32>(w.y), val4(row, i), acc[c] * w.x);
            }
        }
    }
    if (SPLITS == 1u) {
        let ob = params.out_off / 4u + (t * params.heads + h) * HDV4;
        for (var c = 0u; c < VPER; c++) {
            let i = lane + c * LANES;
            if (i < HDV4) {
                out[ob + i] = acc[c] / l;
            }
        }
        return;
    }
    let rb = ((t * params.heads + h) * SPLITS + split) * RECORD;
    if (lane == 0u) {
        out[rb] = vec4<f32>(m, l, 0.0, 0.0);
    }
    for (var c = 0u; c < VPER; c++) {
        let i = lane + c * LANES;
        if (i < HDV4) {
            out[rb + 1u + i] = acc[c];
        }
    }
}
#else
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let h = gid.x;
    let t = gid.y;
    let split = gid.z;
    if (h >= params.heads || t >= params.n) {
        return;
    }
    let kvh = h / (params.heads / params.kv_heads);
#ifdef F16
    var qv: array<vec4<f16>, HD4>;
#else
    var qv: array<vec4<f32>, HD4>;
#endif
    let qb = params.q_off / 4u + (t * params.heads + h) * HD4;
    for (var i = 0u; i < HD4; i++) {
#ifdef F16
        qv[i] = vec4<f16>(q[qb + i]);
#else
        qv[i] = q[qb + i];
#endif
    }
    let span = key_span(t, split);
    let prow = page_row(t);
    var acc: array<vec4<f32>, HDV4>;
    for (var i = 0u; i < HDV4; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    var m = SCORE_FLOOR;
    var l = 0.0;
    for (var j = span.x; j < span.y; j++) {
        let row = kv_slot(prow, j) * params.kv_heads + kvh;
        var dv = vec4<f32>(0.0);
        for (var i = 0u; i < HD4; i++) {
#ifdef F16
            dv += vec4<f32>(qv[i] * key4h(row, i));
#else
            dv = fma(qv[i], key4(row, i), dv);
#endif
        }
        let w = online((dv.x + dv.y + dv.z + dv.w) * params.scale, &m, &l);
        for (var i = 0u; i < HDV4; i++) {
            acc[i] = fma(vec4<f32>(w.y), val4(row, i), acc[i] * w.x);
        }
    }
#ifdef QUANT
    // the head's output (its values exactly as below) rounded block by block into token t's int8 row
    let row = params.out_off + t * params.row_words;
    for (var j = 0u; j < HDV4 / QVEC4; j++) {
        var v: array<vec4<f32>, QVEC4>;
        for (var i = 0u; i < QVEC4; i++) {
            v[i] = acc[j * QVEC4 + i] / l;
        }
        let blk = h * (HDV4 / QVEC4) + j;
        quant_block(&v, row + blk * QVEC4, row + params.heads * HDV4 + blk * META_WORDS);
    }
#else
    if (SPLITS == 1u) {
        let ob = params.out_off / 4u + (t * params.heads + h) * HDV4;
        for (var i = 0u; i < HDV4; i++) {
            out[ob + i] = acc[i] / l;
        }
        return;
    }
    let rb = ((t * params.heads + h) * SPLITS + split) * RECORD;
    out[rb] = vec4<f32>(m, l, 0.0, 0.0);
    for (var i = 0u; i < HDV4; i++) {
        out[rb + 1u + i] = acc[i];
    }
#endif
}
#endif
#endif

#ifdef COMBINE
@group(0) @binding(0) var<storage, read> partial: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> params: Params;

// One invocation per (head, token, vec4 of the output): a head's HDV4 outputs merge in parallel, each
// reading the splits' (max, sum) and its own slice of their outputs. (One invocation per head walked all
// HDV4 x SPLITS records alone, through an array too big for registers: 2.2 of a 6.3 ms Qwen2.5-1.5B step
// on an H200.) Every output is the same sum in the same order as before.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let h = gid.x / HDV4;
    let i = gid.x % HDV4;
    let t = gid.y;
    if (h >= params.heads || t >= params.n) {
        return;
    }
    let rb = (t * params.heads + h) * SPLITS * RECORD;
    var m = SCORE_FLOOR;
    for (var s = 0u; s < SPLITS; s++) {
        m = max(m, partial[rb + s * RECORD].x);
    }
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < SPLITS; s++) {
        let head = partial[rb + s * RECORD];
        let wgt = exp(head.x - m);          // an empty split has sum 0 and contributes nothing
        l += head.y * wgt;
        acc = fma(vec4<f32>(wgt), partial[rb + s * RECORD + 1u + i], acc);
    }
    out[params.out_off / 4u + (t * params.heads + h) * HDV4 + i] = acc / l;
}
#endif
