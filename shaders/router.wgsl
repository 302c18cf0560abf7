// A mixture of experts' router, one invocation per token: probs = softmax (GATING_SOFTMAX) or sigmoid
// (GATING_SIGMOID) of the token's expert logits; the `used` largest probs (ties: the lower expert) give
// ids[t, j] in descending order and weights[t, j] = their probs, divided by their sum (at least
// NORM_MIN, llama.cpp's clamp) when NORM, times `scale`. The ids stay on the GPU for the expert matvecs.
// Few experts (at most MAX_EXPERTS) and few tokens per step: a selection pass per slot is enough.
// Defines: WG, one GATING_*, optional NORM; optional SCALES: each weight then times its expert's entry of
// `scales` (gemma4's per-expert output scales, folded into the weight its output is summed with).
struct Params {
    n: u32,             // tokens
    experts: u32,
    used: u32,          // experts per token
    logits_off: u32,    // element offset of token 0's logits (row stride: experts)
    scale: f32,
    ids_off: u32,       // word offset of token 0's ids (a streamed layer's stop buffer holds two routers')
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
#ifdef SCALES
@group(0) @binding(1) var<storage, read> scales: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
#else
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
#endif

const MAX_EXPERTS: u32 = 256u;
const NORM_MIN: f32 = 6.103515625e-5;

var<private> base: u32;
var<private> top: f32;      // softmax: the largest logit
var<private> inv_sum: f32;  // softmax: 1 / sum of exp(logit - top)

fn prob(e: u32) -> f32 {
    let l = logits[base + e];
#ifdef GATING_SOFTMAX
    return exp(l - top) * inv_sum;
#endif
#ifdef GATING_SIGMOID
    return 1.0 / (1.0 + exp(-l));
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= params.n) {
        return;
    }
    base = params.logits_off + t * params.experts;
#ifdef GATING_SOFTMAX
    top = logits[base];
    for (var e = 1u; e < params.experts; e++) {
        top = max(top, logits[base + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < params.experts; e++) {
        sum += exp(logits[base + e] - top);
    }
    inv_sum = 1.0 / sum;
#endif
    var taken: array<u32, MAX_EXPERTS / 32u>;
    var total = 0.0;
    for (var j = 0u; j < params.used; j++) {
        var best = -1.0;
        var pick = 0u;
        for (var e = 0u; e < params.experts; e++) {
            if ((taken[e / 32u] & (1u << (e % 32u))) != 0u) {
                continue;
            }
            let p = prob(e);
            if (p > best) {
                best = p;
                pick = e;
            }
        }
        taken[pick / 32u] |= 1u << (pick % 32u);
        ids[params.ids_off + t * params.used + j] = pick;
        weights[t * params.used + j] = best;
        total += best;
    }
#ifdef NORM
    let div = max(total, NORM_MIN);
#else
    let div = 1.0;
#endif
    for (var j = 0u; j < params.used; j++) {
        let at = t * params.used + j;
#ifdef SCALES
        weights[at] = weights[at] / div * params.scale * scales[ids[params.ids_off + at]];
#else
        weights[at] = weights[at] / div * params.scale;
#endif
    }
}
