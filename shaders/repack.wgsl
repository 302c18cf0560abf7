// Q8_0 weights rearranged in place into groups of 8 blocks (Q8_0G), once at load, after the file's bytes
// are in the buffer. A group holds 8 consecutive blocks of the tensor part (row-major, as in the file):
//   bytes 0..255:   the 8 blocks' 32 int8 quants, block after block;
//   bytes 256..271: their 8 f16 scales.
// 8 blocks are 272 bytes either way, so the buffer keeps its size (rounded up to whole groups) and every
// group starts on 16 bytes: the int8 matvec reads a block's quants as two vec4<u32> and 8 scales as one,
// instead of the file layout's 9 straddling words per block. Why: on CPU adapters (SwiftShader) the
// matvec is bound by load instructions, not bytes (see shaders/README.md).
// One invocation per group; each reads its 68 words, then writes them back rearranged. Blocks past the
// part's end (the last group's) are zero padding. Defines: WG. Grid: x (and y past 65535 workgroups).
#include "include/bytes.wgsl"

struct Params {
    groups: u32,        // groups to rearrange (ceil(blocks / 8) of the part, or of one streamed expert)
    first: u32,         // the first of them (0, or a streamed expert's slot in an expert cache)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> w: array<u32>;
@group(0) @binding(1) var<uniform> params: Params;

const GROUP_WORDS: u32 = 68u;

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
    var scales = array<u32, 4>(0u, 0u, 0u, 0u);
    for (var j = 0u; j < 8u; j++) {
        // block j's scale at byte 34j (half of a word), its quants from byte 34j + 2
        let d = (raw[(34u * j) >> 2u] >> (((34u * j) & 2u) * 8u)) & 0xffffu;
        scales[j >> 1u] |= d << ((j & 1u) * 16u);
        let i0 = (34u * j + 2u) >> 2u;
        let sh = ((34u * j + 2u) & 3u) * 8u;
        for (var t = 0u; t < 8u; t++) {
            // when sh is 0 the next word is not needed (and past the group for the last block)
            w[base + 8u * j + t] = funnel(raw[i0 + t], raw[min(i0 + t + 1u, GROUP_WORDS - 1u)], sh);
        }
    }
    for (var s = 0u; s < 4u; s++) {
        w[base + 64u + s] = scales[s];
    }
}
