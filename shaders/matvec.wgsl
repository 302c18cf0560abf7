// y[t, r] = sum_k W[r, k] * x[t, k] (+ bias[r]) with W in its GGUF blocks, dequantized on the fly.
// Barrier-free: one invocation computes ROWS consecutive output rows for one token (what CPU adapters
// like lavapipe and SwiftShader want). Grid: x = rows / (WG * ROWS), y = tokens.
// Defines: one W_<type>, WG, ROWS, optional BIAS (a bias, or with a per-token stride a residual: the
// skip connection added in the same pass); REDUCE selects the workgroup-reduction variant below,
// UNIFORM_X (with X_VEC4) reads x as a uniform;
// SUBGROUP (with REDUCE) sums the partials with subgroupAdd instead of a shared-memory tree.
// EXPERTS (no BIAS): a mixture of experts' matmul — "tokens" are (token, slot) pairs, each taking the
// matrix of the expert `ids` names for it (the router wrote them on the GPU: expert choice is data, the
// program stays the same); a pair whose expert lies in another part of the weight is left to that part.
// GLU (one token, no BIAS or EXPERTS): `w` holds gate's m rows and then up's m rows; an invocation (a
// workgroup with REDUCE) takes OUT_ROWS rows of each as its ROWS rows and stores act(gate) * up
// (include/act.wgsl's defines): a gated feed-forward's first half in one pass.
// F16 (devices with shader-f16: real GPUs): products in f16, every sum in f32 (the f32 route's arithmetic
// otherwise).
#ifdef SUBGROUP
#enable subgroups
#endif
#ifdef F16
#enable f16
#endif
#include "include/wtype.wgsl"
#include "include/glu_rows.wgsl"

#include "include/matvec_params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
#ifdef UNIFORM_X
// one token on a CPU adapter: x as a uniform array (X_VEC4 vec4s). Every invocation reads the same
// element, which CPU adapters serve as one broadcast load instead of a per-lane gather (lavapipe: 20-30%
// less CPU time per matvec). Not for REDUCE: there neighbours read different elements.
@group(0) @binding(1) var<uniform> x: array<vec4<f32>, X_VEC4>;
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#endif
#ifdef BIAS
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
#else
#ifdef EXPERTS
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
#endif
#endif

var<private> x_base: u32;   // element index of this token's x row
var<private> w_base: u32;   // byte offset of this token's matrix in w

// Where token (or pair) t reads: x_base and w_base; false when its expert is in another part.
fn locate(t: u32) -> bool {
#ifdef EXPERTS
    let e = ids[t];
    x_base = params.x_off + (t / params.pair_div) * params.k;
    w_base = params.w_off + (e - params.e_first) * params.expert_bytes;
    return e >= params.e_first && e < params.e_first + params.e_count;
#else
    x_base = params.x_off + t * params.k;
    w_base = params.w_off;
    return true;
#endif
}

alias Acc = vec4<f32>;

fn sink(v: vec4<f32>, i: u32, acc: ptr<function, Acc>) {
#ifdef F16
    // products in halves, sums in f32: a K-quant block's 64 products a lane summed in f16 lost 0.4% on an
    // H200 (whose f16 is real; lavapipe's is f32 inside)
    *acc += vec4<f32>(vec4<f16>(v) * vec4<f16>(x[(x_base + i) >> 2u]));
#else
    *acc = fma(v, x[(x_base + i) >> 2u], *acc);
#endif
}

// the block at byte wb (its first element `base`) of a row added into the row's f32 accumulator
fn add_block(wb: u32, base: u32, acc: vec4<f32>) -> vec4<f32> {
    var a = acc;                // (naga 29's SPIR-V writer panics on &acc[r] passed to a function)
    block_apply(wb, base, &a);
    return a;
}

// what output row `row` of token t stores, from its row's sum (and with GLU up's): + bias, or act * up
fn output(row: u32, t: u32, sum: f32, up: f32) -> f32 {
#ifdef GLU
    return act4(vec4<f32>(sum)).x * up;
#else
    var y_r = sum;
#ifdef BIAS
    y_r += bias[params.bias_off + t * params.bias_stride + row];
#endif
    return y_r;
#endif
}

#ifndef REDUCE
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // the token from workgroup_id (workgroup size y is 1): the compiler then knows x's index is the
    // same in every invocation of the workgroup, and CPU adapters load x once instead of gathering it
    let t = wid.y;
    let first = gid.x * OUT_ROWS;
    if (t >= params.n || first >= params.m || !locate(t)) {
        return;
    }
    let nb = params.k / BLOCK_ELEMS;
    // the ROWS rows advance block by block together, so each x vec4 is loaded once for all of them;
    // rows past m repeat the last row (their results are not stored)
    var acc: array<vec4<f32>, ROWS>;
    var wb: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = vec4<f32>(0.0);
        wb[r] = w_base + weight_row(first, r) * params.row_bytes;
    }
    for (var b = 0u; b < nb; b++) {
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = add_block(wb[r] + b * BLOCK_BYTES, b * BLOCK_ELEMS, acc[r]);
        }
    }
    for (var r = 0u; r < OUT_ROWS; r++) {
        let row = first + r;
        if (row >= params.m) {
            return;
        }
        let up = acc[min(r + OUT_ROWS, ROWS - 1u)];        // (read only with GLU)
        y[params.y_off + t * params.y_stride + row] = output(row, t, acc[r].x + acc[r].y + acc[r].z + acc[r].w,
                                                             up.x + up.y + up.z + up.w);
    }
}
#endif

#ifdef REDUCE
// The variant for real GPUs: a workgroup shares ROWS rows, invocation i takes blocks i, i + WG, ...
// (neighbours read neighbouring blocks: coalesced), then a shared-memory tree sums the WG partials.
// Grid: x * z = ceil(m / ROWS) (z when x would pass 65535 workgroups), y = tokens. WG: a power of 2.
var<workgroup> partial_sums: array<f32, WG * ROWS>;

// invocation i's share of weight row `row` (weight_row's)
// (nb: the row's blocks, 0 for a pair another part serves — no early return before the barriers)
fn row_share(row: u32, i: u32, nb: u32) -> f32 {
    let wb = w_base + row * params.row_bytes;
    var acc = vec4<f32>(0.0);
    for (var b = i; b < nb; b += WG) {
        acc = add_block(wb + b * BLOCK_BYTES, b * BLOCK_ELEMS, acc);
    }
    return acc.x + acc.y + acc.z + acc.w;
}

// y[t, row] = output(the row's sum(s)), for rows inside m
fn store_row(row: u32, t: u32, sum: f32, up: f32, mine: bool) {
    if (row >= params.m || !mine) {
        return;
    }
    y[params.y_off + t * params.y_stride + row] = output(row, t, sum, up);
}
#ifndef SUBGROUP

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = wid.y;
    let first = (wid.x + wid.z * nwg.x) * OUT_ROWS;
    if (first >= params.m) {
        return;
    }
    let mine = locate(t);
    let nb = select(0u, params.k / BLOCK_ELEMS, mine);
    for (var r = 0u; r < ROWS; r++) {
        partial_sums[r * WG + lid.x] = row_share(weight_row(first, r), lid.x, nb);
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid.x < stride) {
            for (var r = 0u; r < ROWS; r++) {
                partial_sums[r * WG + lid.x] += partial_sums[r * WG + lid.x + stride];
            }
        }
        workgroupBarrier();
    }
    if (lid.x < OUT_ROWS) {
        let up = partial_sums[min(lid.x + OUT_ROWS, ROWS - 1u) * WG];      // (read only with GLU)
        store_row(first + lid.x, t, partial_sums[lid.x * WG], up, mine);
    }
}
#else
// The same rows and blocks per invocation, summed by subgroupAdd: one barrier instead of log2(WG), and
// one shared-memory slot per subgroup instead of per invocation. The subgroup size is the device's (4 on
// SwiftShader, 4-128 on lavapipe, 32 or 64 on most GPUs), so the slots are indexed by subgroup_id and
// the ROWS first invocations add num_subgroups of them (one when a subgroup spans the workgroup).
// partial_sums keeps WG slots per row: enough for any subgroup size.
@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    let t = wid.y;
    let first = (wid.x + wid.z * nwg.x) * OUT_ROWS;
    if (first >= params.m) {
        return;
    }
    let mine = locate(t);
    let nb = select(0u, params.k / BLOCK_ELEMS, mine);
    for (var r = 0u; r < ROWS; r++) {
        let s = subgroupAdd(row_share(weight_row(first, r), lid.x, nb));
        if (lane == 0u) {
            partial_sums[r * WG + sg] = s;
        }
    }
    workgroupBarrier();
    if (lid.x < OUT_ROWS) {
        var y_r = 0.0;
        var up = 0.0;           // (GLU)
        let u = min(lid.x + OUT_ROWS, ROWS - 1u);
        for (var i = 0u; i < n_sg; i++) {
            y_r += partial_sums[lid.x * WG + i];
            up += partial_sums[u * WG + i];
        }
        store_row(first + lid.x, t, y_r, up, mine);
    }
}
#endif
#endif
