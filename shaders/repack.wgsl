// The int8 route's Q4_0, Q8_0 and Q6_K weights rearranged in place into groups of 8 blocks, once at load,
// after the file's bytes are in the buffer. A group holds 8 consecutive blocks of the tensor part
// (row-major, as in the file):
//   Q8_0 (272 bytes): the 8 blocks' 32 int8 quants, block after block; then their 8 f16 scales.
//   Q4_0 (144 bytes, define Q4_0): the 8 blocks' 16 quant bytes, then their 8 f16 scales.
//   Q6_K (1680 bytes, define Q6_K): the 8 blocks' ql (128 bytes each), then their qh (64 each), their
//   scales (16 each) and their 8 f16 d.
// 8 blocks keep their size either way, so the buffer keeps its size (rounded up to whole groups) and every
// field starts on 16 bytes: the int8 matvec reads them as vec4<u32>s instead of the file layout's
// straddling words (every other block of 18, 34 or 210 bytes starts 2 bytes into a word). Why: on CPU adapters each
// invocation's load is a gather, so the matvec is bound by load instructions, not bytes (see
// shaders/README.md). One invocation per group; each reads its words, then writes them back rearranged.
// Blocks past the part's end (the last group's) are zero padding. Defines: WG, optional Q4_0 or Q6_K. Grid: x (and
// y past 65535 workgroups).
#include "include/bytes.wgsl"

struct Params {
    groups: u32,        // groups to rearrange (ceil(blocks / 8) of the part, or of one streamed expert)
    first: u32,         // the first of them (0, or a streamed expert's slot in an expert cache)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> w: array<u32>;
@group(0) @binding(1) var<uniform> params: Params;

#ifdef Q6_K
const GROUP_WORDS: u32 = 420u;
#else
#ifdef Q4_0
const GROUP_WORDS: u32 = 36u;
#else
const GROUP_WORDS: u32 = 68u;
#endif
#endif

// the word at byte `byte` of the group read into `raw` (any even offset)
fn raw_word(raw: ptr<function, array<u32, GROUP_WORDS>>, byte: u32) -> u32 {
    let i = byte >> 2u;
    // when the offset is word-aligned the next word is not needed (and past the group at its end)
    return funnel((*raw)[i], (*raw)[min(i + 1u, GROUP_WORDS - 1u)], (byte & 3u) * 8u);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) count: vec3<u32>) {
    let i = gid.x + gid.y * count.x * WG;
    if (i >= params.groups) {
        return;
    }
    let g = params.first + i;
    let base = g * GROUP_WORDS;
    var raw: array<u32, GROUP_WORDS>;
    for (var i = 0u; i < GROUP_WORDS; i++) {
        raw[i] = w[base + i];
    }
#ifdef Q6_K
    var ds = array<u32, 4>(0u, 0u, 0u, 0u);
    for (var j = 0u; j < 8u; j++) {
        let at = 210u * j;                   // block j: ql at +0, qh at +128, scales at +192, d at +208
        for (var t = 0u; t < 32u; t++) {
            w[base + 32u * j + t] = raw_word(&raw, at + 4u * t);
        }
        for (var t = 0u; t < 16u; t++) {
            w[base + 256u + 16u * j + t] = raw_word(&raw, at + 128u + 4u * t);
        }
        for (var t = 0u; t < 4u; t++) {
            w[base + 384u + 4u * j + t] = raw_word(&raw, at + 192u + 4u * t);
        }
        ds[j >> 1u] |= (raw_word(&raw, at + 208u) & 0xffffu) << ((j & 1u) * 16u);
    }
    for (var s = 0u; s < 4u; s++) {
        w[base + 416u + s] = ds[s];
    }
#else
    // block j's scale at byte BYTES j, its QWORDS words of quants from 2 bytes on (Q8_0: 34, 8; Q4_0: 18, 4)
#ifdef Q4_0
    let bytes = 18u;
    let qwords = 4u;
#else
    let bytes = 34u;
    let qwords = 8u;
#endif
    var scales = array<u32, 4>(0u, 0u, 0u, 0u);
    for (var j = 0u; j < 8u; j++) {
        scales[j >> 1u] |= (raw_word(&raw, bytes * j) & 0xffffu) << ((j & 1u) * 16u);
        for (var t = 0u; t < qwords; t++) {
            w[base + qwords * j + t] = raw_word(&raw, bytes * j + 2u + 4u * t);
        }
    }
    for (var s = 0u; s < 4u; s++) {
        w[base + 8u * qwords + s] = scales[s];
    }
#endif
}
