// y[t, r] = sum_k W[r, k] * xq[t, k] (+ bias[r]): the weights' integer parts times int8 activations
// (quantize.wgsl's rows) with dot4I8Packed, 4 products per instruction; the float scales are applied
// once per block (or sub-block). This is llama.cpp's CPU arithmetic: on CPU adapters (SwiftShader),
// where per-element float work binds, it does a quarter of the multiply-adds of matvec.wgsl.
// Barrier-free: one invocation computes ROWS consecutive output rows for one token.
// Grid: x = rows / (WG * ROWS), y = tokens (TOKENS: tokens / TOKENS, for steps of several tokens: the
// 32-value block types, whose decoders have block_unpack, unpack each weight block once for TOKENS tokens;
// the K-quants, PIECES, each 32-value piece of a block, with the block's integer sums kept per token);
// with LANES (the number of token pairs, TOKENS / 2) the tokens go in pairs, lanes.wgsl's words at pair_off,
// one i32 multiply for both tokens of a pair (Q4_0, Q4_1, Q4_K: include/unpack_i8.wgsl's lanes16).
// Defines: one W_<type> (Q4_0, Q4_1, Q5_0, Q8_0 read blocks of 32 activations, Q8_0/Q8_1 style; Q4_K,
// Q5_K, Q6_K read Q8_K's blocks of 256), WG, ROWS, optional BIAS (a bias, or a residual: matvec.wgsl); UNIFORM_X (with X_VEC4) binds the
// quantized row as a uniform array (one-token steps on CPU adapters: one broadcast load per read). ROW_GROUP:
// the weight's rows interleaved in groups (include/row_group.wgsl; not with EXPERTS). SPREAD (an even WG):
// an invocation's rows from its place in the workgroup's halves (KernelPolicy.phase_spread): where
// consecutive invocations start at alternating places in repack.wgsl's 8-block groups, lavapipe's SIMD
// passes then read in one phase. Why: on an AMD EPYC host, lanes of mixed phases read Q6_K 1536x8960 (35
// blocks a row, groups of 4 rows) at 5.0-5.2 G elements/s against 6.2-6.5 for 36 blocks; spread 6.0-6.2.
// EXPERTS (no BIAS): rows of y are (token, slot) pairs, each through its expert's matrix (matvec.wgsl);
// with TOKENS also GROUPED: a step's pairs grouped by expert (expert_group.wgsl's table in place of the
// ids), so each block of an expert's matrix is unpacked once for TOKENS of the pairs that chose it.
// GLU (one token, no BIAS): `w` holds gate's m rows and then up's m rows; an invocation's ROWS
// accumulators are OUT_ROWS rows of each, and it stores act(gate) * up (include/act.wgsl's defines):
// a gated feed-forward's first half in one pass.
// Needs the WGSL language feature packed_4x8_integer_dot_product (naga and Chromium's Tint have it).
#include "include/wtype_i8.wgsl"
#include "include/glu_rows.wgsl"
#include "include/row_group.wgsl"

struct Params {
    m: u32,             // output rows
    k: u32,             // input length (a multiple of the activation block)
    n: u32,             // tokens
    row_bytes: u32,     // bytes of one weight row
    w_off: u32,         // byte offset of the tensor in `w` (multiple of 4)
    x_off: u32,         // word offset of token 0's quantized row (multiple of 4)
    y_off: u32,         // element offsets
    bias_off: u32,
    y_stride: u32,      // elements between tokens' rows of y
    bias_stride: u32,   // elements between tokens' bias rows: 0 for a bias, the row width for a residual
    x_row_words: u32,   // words per quantized token row (quantize.wgsl's row_words)
    // EXPERTS: as in include/matvec_params.wgsl
    expert_bytes: u32,
    pair_div: u32,
    e_first: u32,
    e_count: u32,
    e_tiles: u32,       // GROUPED: workgroup rows per expert (ceil(tokens / TOKENS))
    n_experts: u32,     // GROUPED: experts of the whole weight (the group table's offsets)
    pair_off: u32,      // LANES: word offset of the token pairs' rows (lanes.wgsl)
    _pad1: u32,
    _pad2: u32,
}

#ifdef W_VEC4
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(0) var<storage, read> w: array<u32>;
#endif
#ifdef UNIFORM_X
@group(0) @binding(1) var<uniform> x: array<vec4<u32>, X_VEC4>;
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
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

var<private> x_base: u32;   // vec4 index of this token's quantized values
var<private> m_base: u32;   // vec4 index of this token's block metadata

// four words of int8 activations: elements 16j..16j+15 of the row
fn xv(j: u32) -> vec4<u32> {
    return x[x_base + j];
}

#ifdef LANES
// vec4 i of the buffer as a token pair's lane words
fn lane(i: u32) -> vec4<i32> {
    return bitcast<vec4<i32>>(x[i]);
}

// vec4 j of quantized row `row`'s block metadata (xm's, for a row other than the current token's)
fn row_meta(row: u32, j: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(x[((params.x_off + row * params.x_row_words) >> 2u) + params.k / 16u + j]);
}
#endif

// vec4 j of the row's block metadata
fn xm(j: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(x[m_base + j]);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // the token from workgroup_id: x's index is then visibly the same across the workgroup (TOKENS: the
    // first of the invocation's tokens)
#ifdef TOKENS
    let t = wid.y * TOKENS;
#else
    let t = wid.y;
#endif
#ifdef SPREAD
    // the workgroup's first half of invocations takes its even rows' invocations, the second half the odd
    // ones (a permutation within the workgroup: the same rows are covered)
    let lane = gid.x % WG;
    let first = (gid.x - lane + lane % (WG / 2u) * 2u + lane / (WG / 2u)) * OUT_ROWS;
#else
    let first = gid.x * OUT_ROWS;
#endif
    var w_base = params.w_off;
#ifdef GROUPED
    // workgroup row y: expert e of this part, and the tile of its pairs starting at `start` in the table
    let e = params.e_first + wid.y / params.e_tiles;
    let start = ids[e] + (wid.y % params.e_tiles) * TOKENS;
    let end = ids[e + 1u];
    if (start >= end || first >= params.m) {
        return;
    }
    w_base += (e - params.e_first) * params.expert_bytes;
    let count = min(TOKENS, end - start);
    var x_rows: array<u32, TOKENS>;     // the quantized row each of the tile's pairs reads, and its y row
    var y_rows: array<u32, TOKENS>;
#unroll I TOKENS
    y_rows[I] = ids[params.n_experts + 1u + start + min(I, count - 1u)];
    x_rows[I] = y_rows[I] / params.pair_div;
#endunroll
#else
    if (t >= params.n || first >= params.m) {
        return;
    }
    var x_row = t;              // which quantized row token (or pair) t reads
#ifdef TOKENS
    let count = min(TOKENS, params.n - t);
    var x_rows: array<u32, TOKENS>;
    var y_rows: array<u32, TOKENS>;
#unroll I TOKENS
    x_rows[I] = min(t + I, params.n - 1u);
    y_rows[I] = t + I;
#endunroll
#endif
#ifdef EXPERTS
    let e = ids[t];
    if (e < params.e_first || e >= params.e_first + params.e_count) {
        return;                 // another part of the weight holds this pair's expert
    }
    w_base += (e - params.e_first) * params.expert_bytes;
    x_row = t / params.pair_div;
#endif
#endif
    let nb = params.k / BLOCK_ELEMS;
    // (rows written out by the preprocessor: a private array indexed by a loop counter lives in memory on SwiftShader,
    // each access per lane; with constant indices its elements are registers. 2048x4096 one token, 4 rows:
    // Q4_K 12.4 -> about 9 ms, Q6_K 18-21 -> 12-14)
    var wb: array<u32, ROWS>;
#unroll R ROWS
    wb[R] = w_base + row_start(weight_row(first, R));
#endunroll
#ifdef TOKENS
    // tokens t..t+TOKENS-1 (past n: the last token again, not stored; GROUPED: the tile's pairs); each block of each row is unpacked
    // once for all of them, and each token's activation block is loaded once for all rows (tokens and rows
    // written out, as the one-token rows below)
    var accs: array<array<f32, ROWS>, TOKENS>;
#ifdef LANES
    var lane_rows: array<u32, LANES>;   // vec4 index of each pair's row (a pair holds tokens 2p, 2p + 1)
#unroll J LANES
    lane_rows[J] = (params.pair_off + x_rows[2u * J] / 2u * params.k) >> 2u;
#endunroll
#endif
    for (var b = 0u; b < nb; b++) {
#ifdef PIECES
        // a K-quant block piece by piece (include/pieces_i8.wgsl), its integer sums per token and row
        var heads: array<KHead, ROWS>;
#unroll R ROWS
        heads[R] = block_head(wb[R] + b * BLOCK_STEP);
#endunroll
        // (initialized explicitly: naga declares a loop's vars once, at the function's start)
        var sums = array<array<vec2<i32>, ROWS>, TOKENS>();
        for (var p = 0u; p < PIECES; p++) {
            var pcs: array<WPiece, ROWS>;
#unroll R ROWS
            pcs[R] = piece_unpack(wb[R] + b * BLOCK_STEP, heads[R], p);
#endunroll
            let s_at = 5u * b + 1u + (p >> 1u);     // Q8_K's sums of 16, two per piece
#ifdef LANES
            // tokens in pairs (lanes.wgsl), as the 32-value blocks below
#unroll J LANES
            {
                let pv = lane_rows[J] + 64u * b + 8u * p;
                let pw = PairWords(lane(pv), lane(pv + 1u), lane(pv + 2u), lane(pv + 3u),
                                   lane(pv + 4u), lane(pv + 5u), lane(pv + 6u), lane(pv + 7u));
                let s0 = vec4<i32>(row_meta(x_rows[2u * J], s_at));
                let s1 = vec4<i32>(row_meta(x_rows[2u * J + 1u], s_at));
                let odd = (p & 1u) == 1u;
                let h0 = select(s0.xy, s0.zw, odd);
                let h1 = select(s1.xy, s1.zw, odd);
#unroll R ROWS
                { let v = piece_lanes(pcs[R], pw, h0, h1); sums[2u * J][R] += v.xy; sums[2u * J + 1u][R] += v.zw; }
#endunroll
            }
#endunroll
#else
#unroll I TOKENS
            {
                x_base = (params.x_off + x_rows[I] * params.x_row_words) >> 2u;
                m_base = x_base + params.k / 16u;
                let xa = xv(16u * b + 2u * p);
                let xb = xv(16u * b + 2u * p + 1u);
                let s16 = vec4<i32>(xm(s_at));
                let s = select(s16.xy, s16.zw, (p & 1u) == 1u);
#unroll R ROWS
                sums[I][R] += piece_apply(pcs[R], xa, xb, s);
#endunroll
            }
#endunroll
#endif
        }
#unroll I TOKENS
        {
            x_base = (params.x_off + x_rows[I] * params.x_row_words) >> 2u;
            m_base = x_base + params.k / 16u;
            let dx = xm(5u * b).x;
#unroll R ROWS
            accs[I][R] += block_finish(heads[R], sums[I][R], dx);
#endunroll
        }
#endunroll
#else
        var blk: array<WBlock, ROWS>;
#unroll R ROWS
        blk[R] = block_unpack(wb[R] + b * BLOCK_STEP);
#endunroll
#ifdef LANES
        // tokens in pairs, each element of a pair one i32 (lanes.wgsl): one multiply for both tokens
#unroll J LANES
        {
            let pv = lane_rows[J] + 8u * b;
            let pw = PairWords(lane(pv), lane(pv + 1u), lane(pv + 2u), lane(pv + 3u),
                               lane(pv + 4u), lane(pv + 5u), lane(pv + 6u), lane(pv + 7u));
            let m0 = row_meta(x_rows[2u * J], b);
            let m1 = row_meta(x_rows[2u * J + 1u], b);
#unroll R ROWS
            { let v = block_lanes(blk[R], pw, m0, m1); accs[2u * J][R] += v.x; accs[2u * J + 1u][R] += v.y; }
#endunroll
        }
#endunroll
#else
#unroll I TOKENS
        {
            x_base = (params.x_off + x_rows[I] * params.x_row_words) >> 2u;
            m_base = x_base + params.k / 16u;
            let xa = xv(2u * b);
            let xb = xv(2u * b + 1u);
            let m = xm(b);
#unroll R ROWS
            accs[I][R] += block_apply(blk[R], xa, xb, m);
#endunroll
        }
#endunroll
#endif
#endif
    }
    for (var i = 0u; i < count; i++) {
        store_rows(y_rows[i], first, accs[i]);
    }
}
#else
    x_base = (params.x_off + x_row * params.x_row_words) >> 2u;
    m_base = x_base + params.k / 16u;
    var acc: array<f32, ROWS>;
#ifdef ROW_BLOCKS
    // a repacked layout: its decoder takes the rows' first block indices and does block b of every row in
    // one call (the activation block loaded once)
#unroll R ROWS
    wb[R] /= BLOCK_BYTES;
#endunroll
    for (var b = 0u; b < nb; b++) {
        block_dots(b, &wb, &acc);
    }
#else
    for (var b = 0u; b < nb; b++) {
#unroll R ROWS
        acc[R] += block_dot(wb[R] + b * BLOCK_STEP, b);
#endunroll
    }
#endif
    store_rows(t, first, acc);
}
#endif

// token t's results for rows first..first+OUT_ROWS-1 (those below m)
fn store_rows(t: u32, first: u32, acc: array<f32, ROWS>) {
    for (var r = 0u; r < OUT_ROWS; r++) {
        let row = first + r;
        if (row >= params.m) {
            return;
        }
#ifdef GLU
        var y_r = act4(vec4<f32>(acc[r])).x * acc[r + OUT_ROWS];
#else
        var y_r = acc[r];
#endif
#ifdef BIAS
        y_r += bias[params.bias_off + t * params.bias_stride + row];
#endif
        y[params.y_off + t * params.y_stride + row] = y_r;
    }
}
