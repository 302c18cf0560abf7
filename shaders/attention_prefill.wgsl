// Causal prefill attention, tiled over the keys, for real GPUs: out[t, h, :] = softmax_j(softcap(scale *
// q[t,h]·k[j, h/G])) · v[j, h/G] over key positions j in [lo(t), pos(t)], lo = max(0, pos - window + 1)
// for sliding-window layers, else 0 (the pages and rings as in attention.wgsl's header).
// A workgroup serves one KV head and QB = WG / G consecutive query tokens of its G query heads, one
// invocation per (token, head). It walks the keys its tokens need in tiles of KTILE: the tile's K and V
// rows are read from the cache (any type, include/kv.wgsl) into workgroup memory once, as f32, and every
// invocation consumes them with an online softmax (one rescale per tile, not per key). Needs the step's
// positions increasing by one per token (what a prefill chunk is) and G <= WG.
// Grid: x = kv_heads, y = ceil(n / QB). Defines: WG, HD4, HDV4, KTILE (keys per tile: the executor sizes
// K + V tiles to 16 KiB), optional SOFTCAP, and KV_F16 or KV_Q8.
#include "include/attention_params.wgsl"

const SCORE_FLOOR: f32 = -3.0e38;   // the running max before any key (finite: exp() of differences stays defined)
const TANH_CLAMP: f32 = 15.0;       // tanh is 1 to f32 precision beyond this; clamping avoids inf/inf in exp-based tanh

#include "include/kv.wgsl"
#include "include/exact.wgsl"

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<KVCell>;
@group(0) @binding(2) var<storage, read> vc: array<KVCell>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> params: Params;

var<workgroup> kt: array<vec4<f32>, KTILE * HD4>;
var<workgroup> vt: array<vec4<f32>, KTILE * HDV4>;

fn first_key(pos: u32) -> u32 {
    if (params.window > 0u && pos + 1u > params.window) {
        return pos + 1u - params.window;
    }
    return 0u;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let kvh = wid.x;
    let g = params.heads / params.kv_heads;
    let qb = WG / g;                                    // query tokens per workgroup
    let t0 = wid.y * qb;
    let t = t0 + lid / g;
    let h = kvh * g + lid % g;
    let live = lid < qb * g && t < params.n;
    // the keys any of the workgroup's tokens needs: positions increase with t
    let t_last = min(t0 + qb, params.n) - 1u;
    let k_lo = first_key(positions[params.pos_off + t0]);
    let k_hi = positions[params.pos_off + t_last];
    let prow = page_row(t0);                            // the step's tokens are one sequence's

    var qv: array<vec4<f32>, HD4>;
    var pos = 0u;
    var lo = 0u;
    if (live) {
        let qbase = params.q_off / 4u + (t * params.heads + h) * HD4;
        for (var i = 0u; i < HD4; i++) {
            qv[i] = q[qbase + i];
        }
        pos = positions[params.pos_off + t];
        lo = first_key(pos);
    }
    var acc: array<vec4<f32>, HDV4>;
    var m = SCORE_FLOOR;
    var l = 0.0;
    for (var j0 = k_lo; j0 <= k_hi; j0 += KTILE) {
        workgroupBarrier();                             // the previous tile is consumed
        for (var idx = lid; idx < KTILE * HD4; idx += WG) {
            let j = min(j0 + idx / HD4, k_hi);          // past k_hi: a repeat, masked below
            kt[idx] = key4(kv_slot(prow, j) * params.kv_heads + kvh, idx % HD4);
        }
        for (var idx = lid; idx < KTILE * HDV4; idx += WG) {
            let j = min(j0 + idx / HDV4, k_hi);
            vt[idx] = val4(kv_slot(prow, j) * params.kv_heads + kvh, idx % HDV4);
        }
        workgroupBarrier();
        // this tile's scores of the invocation's query; keys outside [lo, pos] are masked
        var s: array<f32, KTILE>;
        var tile_max = SCORE_FLOOR;
        for (var r = 0u; r < KTILE; r++) {
            let j = j0 + r;
            s[r] = SCORE_FLOOR;
            if (live && j >= lo && j <= pos) {
                var dv = vec4<f32>(0.0);
                for (var i = 0u; i < HD4; i++) {
                    dv = fma(qv[i], kt[r * HD4 + i], dv);
                }
                var sc = (dv.x + dv.y + dv.z + dv.w) * params.scale;
#ifdef SOFTCAP
                sc = params.softcap * tanh_exact1(clamp(sc / params.softcap, -TANH_CLAMP, TANH_CLAMP));
#endif
                s[r] = sc;
                tile_max = max(tile_max, sc);
            }
        }
        if (tile_max > SCORE_FLOOR) {
            let m_new = max(m, tile_max);
            let corr = exp(m - m_new);
            l *= corr;
            for (var i = 0u; i < HDV4; i++) {
                acc[i] *= corr;
            }
            for (var r = 0u; r < KTILE; r++) {
                if (s[r] > SCORE_FLOOR) {
                    let p = exp(s[r] - m_new);
                    l += p;
                    for (var i = 0u; i < HDV4; i++) {
                        acc[i] = fma(vec4<f32>(p), vt[r * HDV4 + i], acc[i]);
                    }
                }
            }
            m = m_new;
        }
    }
    if (live) {
        let ob = params.out_off / 4u + (t * params.heads + h) * HDV4;
        for (var i = 0u; i < HDV4; i++) {
            out[ob + i] = acc[i] / l;
        }
    }
}
