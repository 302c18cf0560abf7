// A weight's rows rearranged into include/row_group.wgsl's layout, once at load: rows in groups of
// ROW_GROUP, each group's blocks ordered block index first, so block b of the group's rows 0..G-1 lie side
// by side. A group keeps its bytes (G rows' worth), so the tensor keeps its size and every group its
// offset. Out of place: `src` holds a copy of some whole groups in the file's layout (pyshim.gpu.slots
// copies them there a chunk at a time), `dst` is the weight's buffer. One invocation per block.
// Defines: WG, ROW_GROUP. Grid: x (and y past 65535 workgroups).

struct Params {
    blocks: u32,        // blocks in `src` (whole groups)
    row_blocks: u32,    // blocks per row
    block_words: u32,   // u32 words per block
    dst_off: u32,       // word offset in `dst` of the first group
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) count: vec3<u32>) {
    let q = gid.x + gid.y * count.x * WG;          // the block's place in the new layout
    if (q >= params.blocks) {
        return;
    }
    let i = q % ROW_GROUP;                          // row i of group g, block b
    let b = q / ROW_GROUP % params.row_blocks;
    let g = q / ROW_GROUP / params.row_blocks;
    let at = ((g * ROW_GROUP + i) * params.row_blocks + b) * params.block_words;
    let to = params.dst_off + q * params.block_words;
    for (var j = 0u; j < params.block_words; j++) {
        dst[to + j] = src[at + j];
    }
}
