// Where weight row r's blocks lie in its buffer (bytes from the tensor's start; the including kernel's
// `params.row_bytes` and its decoder's BLOCK_BYTES): the file's layout, row after row, or with ROW_GROUP
// interleave.wgsl's, where block b of ROW_GROUP consecutive rows lie side by side (row r's block b at
// row_start(r) + b * BLOCK_STEP). Why: on lavapipe an invocation reads its rows block by block, and in
// the file's layout those reads are ROW_GROUP runs a row apart, which the CPU's prefetchers follow poorly
// (Q4_K 8960x1536 gate-and-up, 8 rows of each an invocation, weights streamed from memory: 7.3 G
// elements/s, 10.2-10.5 with every row reading the same cached bytes); interleaved they are one run.
// (Grouped types: repack.wgsl groups the interleaved blocks, and their decoders take the block index
// offset / BLOCK_BYTES, which these offsets keep.)
#ifdef ROW_GROUP
const BLOCK_STEP: u32 = ROW_GROUP * BLOCK_BYTES;

fn row_start(r: u32) -> u32 {
    return r / ROW_GROUP * ROW_GROUP * params.row_bytes + r % ROW_GROUP * BLOCK_BYTES;
}
#else
const BLOCK_STEP: u32 = BLOCK_BYTES;

fn row_start(r: u32) -> u32 {
    return r * params.row_bytes;
}
#endif
