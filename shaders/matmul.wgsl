// y[t, r] = sum_k W[r, k] * x[t, k] (+ bias[r]) for steps of many tokens (prefill), workgroup-tiled for
// real GPUs. A workgroup owns a tile of TM rows x TN tokens and walks k in steps of KT: per step it
// dequantizes its rows' KT-wide slice of W from the GGUF blocks into workgroup memory once — every one of
// its TN tokens then reuses it, where the matvec decodes each weight once per token — and copies the
// tokens' slice of x likewise; each invocation accumulates RM rows x RN tokens from the two tiles
// (register tiling: RM + RN vec4 loads per RM * RN dot products). Blocks wider than KT (the K-quants,
// 256) are decoded whole and only the step's slice is kept: 256 / KT times the decode work, over TN tokens.
// Not for CPU adapters: workgroup barriers are what SwiftShader and lavapipe do worst (FACTS.md).
// Grid: x = ceil(m / TM), y = ceil(n / TN). Defines: one W_<type>, the tile shape (below), WG, optional BIAS;
// F16 (devices with shader-f16): the tiles in f16 (half the workgroup memory) and each vec4 dot product in
// f16, summed into f32 accumulators.
#ifdef F16
#enable f16
alias TileV = vec4<f16>;
#else
alias TileV = vec4<f32>;
#endif
#include "include/wtype.wgsl"

#include "include/matvec_params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#ifdef BIAS
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
#endif

// The tile shape comes as defines: TM weight rows x TN tokens per workgroup, KT elements of k per step,
// RM rows x RN tokens per invocation (WG = TM / RM * TN / RN invocations); the two tiles take
// (TM + TN) * KT * 4 bytes of workgroup memory (the default 32, 32, 64: 16 KiB, WebGPU's guaranteed limit).
const KV4: u32 = KT / 4u;       // vec4s per tile row (a power of 2: see tile_at)
const GM: u32 = TM / RM;        // invocations along rows; WG = GM * GN
const GN: u32 = TN / RN;
// decode jobs per step: one per (tile row, block of the slice); K-quant blocks cover the slice alone
const BPT: u32 = max(KT / BLOCK_ELEMS, 1u);
const JOBS: u32 = TM * BPT;

var<workgroup> wt: array<TileV, TM * KV4>;
var<workgroup> xt: array<TileV, TN * KV4>;

// Vec4 j of tile row r, rotated by r: the GM invocations reading vec4 j of rows gx, gx + GM, ... at once
// then hit different memory banks (an unrotated row stride of 16 vec4s puts them all in one).
fn tile_at(r: u32, j: u32) -> u32 {
    return r * KV4 + ((j + r) & (KV4 - 1u));
}

alias Acc = u32;                // the decoded row's tile row
var<private> win_lo: u32;       // first element of this step's slice of k

// block_apply hands over elements i..i+3 of the row: keep those inside the slice
fn sink(v: vec4<f32>, i: u32, acc: ptr<function, Acc>) {
    let e = i - win_lo;         // wraps past KT for elements before the slice
    if (e < KT) {
        wt[tile_at(*acc, e >> 2u)] = TileV(v);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row0 = wid.x * TM;
    let t0 = wid.y * TN;
    let nb = params.k / BLOCK_ELEMS;
    let gx = lid % GM;
    let gy = lid / GM;
    var acc: array<f32, RM * RN>;
    for (var k0 = 0u; k0 < params.k; k0 += KT) {
        win_lo = k0;
        // W slice: rows past m repeat the last row (never stored); blocks past k are zeros
        for (var job = lid; job < JOBS; job += WG) {
            var r = job / BPT;
            let b = k0 / BLOCK_ELEMS + job % BPT;
            if (b < nb) {
                let row = min(row0 + r, params.m - 1u);
                block_apply(params.w_off + row * params.row_bytes + b * BLOCK_BYTES, b * BLOCK_ELEMS, &r);
            } else {
                for (var e = b * BLOCK_ELEMS - k0; e < (b + 1u) * BLOCK_ELEMS - k0; e += 4u) {
                    wt[tile_at(r, e >> 2u)] = TileV(0.0);
                }
            }
        }
        // x slice: tokens past n and elements past k are zeros
        for (var idx = lid; idx < TN * KV4; idx += WG) {
            let tl = idx / KV4;
            let j = idx % KV4;
            let t = t0 + tl;
            var v = vec4<f32>(0.0);
            if (t < params.n && k0 + 4u * j < params.k) {
                v = x[(params.x_off + t * params.k + k0) / 4u + j];
            }
            xt[tile_at(tl, j)] = TileV(v);
        }
        workgroupBarrier();
        for (var j = 0u; j < KV4; j++) {
            var wv: array<TileV, RM>;
            for (var i = 0u; i < RM; i++) {
                wv[i] = wt[tile_at(gx + GM * i, j)];
            }
            for (var u = 0u; u < RN; u++) {
                let xv = xt[tile_at(gy + GN * u, j)];
                for (var i = 0u; i < RM; i++) {
                    acc[i * RN + u] += f32(dot(wv[i], xv));
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < RM; i++) {
        let row = row0 + gx + GM * i;
        for (var u = 0u; u < RN; u++) {
            let t = t0 + gy + GN * u;
            if (row < params.m && t < params.n) {
                var v = acc[i * RN + u];
#ifdef BIAS
                v += bias[params.bias_off + t * params.bias_stride + row];
#endif
                y[params.y_off + t * params.y_stride + row] = v;
            }
        }
    }
}
