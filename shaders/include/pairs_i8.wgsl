// block_dot for the 32-value blocks whose f16 scale d comes first (Q5_0), one block or
// two per call; the including file declares SINGLE_BYTES (one block's size, 2 mod 4) and block_dot_at.
#ifdef PAIRS
// Two blocks per call (rows of an even block count start word-aligned): the first block's fields sit
// 2 bytes into their words, the second's are aligned, so both shifts are constants.
const BLOCK_ELEMS: u32 = 64u;
const BLOCK_BYTES: u32 = 2u * SINGLE_BYTES;

fn block_dot(wb: u32, b: u32) -> f32 {
    return block_dot_at(wb, 2u * b, 16u) + block_dot_at(wb + SINGLE_BYTES, 2u * b + 1u, 0u);
}
#else
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = SINGLE_BYTES;

fn block_dot(wb: u32, b: u32) -> f32 {
    return block_dot_at(wb, b, ((wb + 2u) & 3u) * 8u);
}
#endif
