// The adapter's streaming roofline: each invocation sums a contiguous run of `per_thread` vec4s of a
// large f32 buffer (the same access shape as the barrier-free matvec: one stream per invocation) and
// writes one float so the reads cannot be optimized away. STRIDED: the coalesced order instead (a GPU's
// best). I8: the same 16-byte loads read as sixteen int8 values, each word dot4I8Packed against a
// constant as the int8 route's matvecs do (the element type they use: on a CPU adapter the instructions,
// not the bytes, can bind). The benchmark keeps the best of the passes. Defines: WG, optional STRIDED, I8.
struct Params {
    n4: u32,            // vec4s in the buffer
    per_thread: u32,
    _pad0: u32,
    _pad1: u32,
}

#ifdef I8
@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
#else
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
#endif
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

#ifdef I8
const ONES: u32 = 0x01010101u;      // four int8 ones: each word's dot product is the sum of its bytes
fn load(i: u32) -> vec4<f32> {
    let w = x[i];
    return vec4<f32>(f32(dot4I8Packed(w.x, ONES)), f32(dot4I8Packed(w.y, ONES)), f32(dot4I8Packed(w.z, ONES)),
                     f32(dot4I8Packed(w.w, ONES)));
}
#else
fn load(i: u32) -> vec4<f32> {
    return x[i];
}
#endif

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var acc = vec4<f32>(0.0);
#ifdef STRIDED
    // invocation g reads vec4s g, g + T, g + 2T, ... (T = invocations): neighbours read neighbours
    let threads = (params.n4 + params.per_thread - 1u) / params.per_thread;
    if (gid.x >= threads) {
        return;
    }
    for (var i = gid.x; i < params.n4; i += threads) {
        acc += load(i);
    }
#else
    let start = gid.x * params.per_thread;
    if (start >= params.n4) {
        return;
    }
    let end = min(start + params.per_thread, params.n4);
    for (var i = start; i < end; i++) {
        acc += load(i);
    }
#endif
    y[gid.x] = acc.x + acc.y + acc.z + acc.w;
}
