// The uniform params of matvec.wgsl and matmul.wgsl (kernels.PARAMS["matvec"]): y = x @ W^T (+ bias, or + a residual:
// BIAS with a per-token stride adds the skip connection in the same pass).
struct Params {
    m: u32,             // output rows
    k: u32,             // input length (a multiple of BLOCK_ELEMS)
    n: u32,             // tokens
    row_bytes: u32,     // bytes of one weight row
    w_off: u32,         // byte offset of the tensor in `w` (multiple of 4)
    x_off: u32,         // element offsets (multiples of 4)
    y_off: u32,
    bias_off: u32,
    bias_stride: u32,   // elements between tokens' bias rows: 0 for a bias, the row width for a residual
    y_stride: u32,      // elements between tokens' rows of y (m, or the whole width when W is split by rows)
    // EXPERTS (matvec.wgsl): `w` holds experts e_first .. e_first + e_count - 1 of a 3-D weight, each
    // expert_bytes long; row t of y is (token, slot) pair t, whose x row is t / pair_div
    expert_bytes: u32,
    pair_div: u32,
    e_first: u32,
    e_count: u32,
    _pad0: u32,
    _pad1: u32,
}
