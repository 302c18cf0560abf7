// The rows a matvec invocation (or workgroup) reads for its output rows: ROWS of them, or with GLU
// OUT_ROWS = ROWS / 2 of gate and as many of up, whose rows follow gate's m rows in `w` (the epilogue then
// stores act(gate) * up: include/act.wgsl). Uses the including kernel's `params.m`.
#ifdef GLU
#include "include/act.wgsl"
const OUT_ROWS: u32 = ROWS / 2u;
#else
const OUT_ROWS: u32 = ROWS;
#endif

// the weight row behind accumulator r of an invocation whose first output row is `first` (rows past m
// repeat the last one: their results are not stored)
fn weight_row(first: u32, r: u32) -> u32 {
#ifdef GLU
    if (r >= OUT_ROWS) {
        return params.m + min(first + r - OUT_ROWS, params.m - 1u);
    }
#endif
    return min(first + r, params.m - 1u);
}
