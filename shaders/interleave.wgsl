// A weight's rows rearranged into include/row_group.wgsl's layout, once at load: rows in groups of
// ROW_GROUP, each group's blocks ordered block index first, so block b of the group's rows 0..G-1 lie side
// by side. A group keeps its bytes (G rows' worth), so the tensor keeps its size and every group its
// offset. Out of place: `src` holds a copy of some whole groups in the file's layout (pyshim.gpu.slots
// copies them there a chunk at a time), `dst` is the weight's buffer. One invocation per block, or with
// PAIRS per two blocks: blocks 2 bytes past a whole number of words (Q6_K's 210 bytes, before repack.wgsl
// groups them) start 2 bytes into a word every other block, and two of them are whole words.
// Defines: WG, ROW_GROUP, optional PAIRS. Grid: x (and y past 65535 workgroups).

struct Params {
    blocks: u32,        // blocks in `src` (whole groups)
    row_blocks: u32,    // blocks per row
    block_bytes: u32,   // bytes per block (a multiple of 4, or of 2 with PAIRS)
    dst_off: u32,       // word offset in `dst` of the first group
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

// byte offset in `src` of the block that goes to place q of the new layout: row i of group g, block b
fn source(q: u32) -> u32 {
    let i = q % ROW_GROUP;
    let b = q / ROW_GROUP % params.row_blocks;
    let g = q / ROW_GROUP / params.row_blocks;
    return ((g * ROW_GROUP + i) * params.row_blocks + b) * params.block_bytes;
}

// the word at an even byte offset of `src`
fn word_at(byte: u32) -> u32 {
    let i = byte >> 2u;
    if ((byte & 3u) == 0u) {
        return src[i];
    }
    return (src[i] >> 16u) | (src[i + 1u] << 16u);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) count: vec3<u32>) {
    let id = gid.x + gid.y * count.x * WG;
    let bb = params.block_bytes;
#ifdef PAIRS
    let q = 2u * id;
    if (q >= params.blocks) {
        return;
    }
    let a = source(q);
    let b = source(q + 1u);
    let to = params.dst_off + q * bb / 4u;
    for (var o = 0u; o < 2u * bb; o += 4u) {
        var word: u32;
        if (o + 4u <= bb) {
            word = word_at(a + o);
        } else if (o >= bb) {
            word = word_at(b + o - bb);
        } else {                    // the word the two blocks share: a's last 2 bytes, b's first 2
            word = (word_at(a + o) & 0xFFFFu) | (word_at(b) << 16u);
        }
        dst[to + o / 4u] = word;
    }
#else
    if (id >= params.blocks) {
        return;
    }
    let at = source(id) / 4u;
    let to = params.dst_off + id * bb / 4u;
    for (var j = 0u; j < bb / 4u; j++) {
        dst[to + j] = src[at + j];
    }
#endif
}
