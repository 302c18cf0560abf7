// The K-quant types' blocks of 256 in pieces of 32 (sub-blocks of Q4_K/Q5_K, pairs of Q6_K's 16-value
// groups), for the TOKENS variant of matvec_i8: each piece of a weight row is unpacked once for several
// tokens, and the integer sums of a block are the one-token decoder's, so results are equal word for word.
// The including decoder defines PIECES (pieces a block: 8), block_head(wb) -> KHead (the block's floats and scale words),
// piece_unpack(wb, head, p) -> WPiece, piece_apply(piece, xa, xb, sums) -> the piece's integer
// contribution, and block_finish(head, sums, d_x) -> f32; Q4_K also piece_lanes (LANES: two tokens at once).
struct WPiece {
    lo: vec4<u32>,      // elements 0..15 of the piece as int8 (unsigned values)
    hi: vec4<u32>,      // elements 16..31
    sc: vec2<i32>,      // Q4_K/Q5_K: the sub-block's (scale, min); Q6_K: its two groups' scales
}

struct KHead {
    d: f32,
    dmin: f32,          // Q4_K/Q5_K's dmin, else 0
    s: vec4<u32>,       // the scale bytes (Q4_K/Q5_K: 12, Q6_K: 16)
}
