// The grouped 32-value types' int8 decoders (Q4_0, Q8_0 in repack.wgsl's layout) beyond their block_at(i)
// -> WBlock: block_unpack by the file-layout byte offset (as TOKENS passes it), and ROW_BLOCKS, which
// matvec_i8 uses to pass each row's first block index (its file-layout byte offset over BLOCK_BYTES) and
// get block b of all ROWS rows at once, the activation block loaded once.
#define ROW_BLOCKS

fn block_unpack(wb: u32) -> WBlock {
    return block_at(wb / BLOCK_BYTES);
}

fn block_dots(b: u32, first: ptr<function, array<u32, ROWS>>, acc: ptr<function, array<f32, ROWS>>) {
    let xa = xv(2u * b);
    let xb = xv(2u * b + 1u);
    let m = xm(b);
#unroll R ROWS
    (*acc)[R] += block_apply(block_at((*first)[R] + b), xa, xb, m);
#endunroll
}
