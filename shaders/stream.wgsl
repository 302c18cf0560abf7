// The adapter's streaming roofline: each invocation sums a contiguous run of `per_thread` vec4s of a
// large f32 buffer (the same access shape as the barrier-free matvec: one stream per invocation) and
// writes one float so the reads cannot be optimized away. STRIDED: the coalesced order instead (a GPU's
// best). I8: the same 16-byte loads read as sixteen int8 values, each word dot4I8Packed against a word of
// int8 activations from a uniform array, as the int8 route's matvecs take them (the element type and
// operation they use: on a CPU adapter the instructions, not the bytes, can bind). Against a constant
// word of ones instead, the compiler folds the multiplies into a byte sum, an operation no matvec can
// use: lavapipe read 8.2-8.6 G int8 elements/s that way and 6.1 against activations (2-core Zen 4).
// I4: the same loads as 32 4-bit values (each byte's low and high nibble), both halves of each word
// dotted with activations, as the int8 route's 4-bit types (Q4_0, Q4_K) are: half the bytes an element,
// so on lavapipe the 4-bit matvecs outrun the int8 stream, and their own element is the roofline for them.
// Both integer probes keep their sums in integers and their activations in registers: with a float sum
// per word and the activations indexed by the loop's counter (per lane on SwiftShader), the probe read
// 1.0 G 4-bit elements/s on SwiftShader and 7.6 on lavapipe, and the rows-unrolled Q4_K matvec passed it;
// this way 1.3 and 12.6.
// I6: the same loads as Q6_K's 6-bit values (include/q6_kg_i8.wgsl): each three vec4s are 64 of them, two
// vec4s of low nibbles and one of the 2-bit tops, each element's nibble and top joined into a byte as the
// Q6_K decoder joins them, then dotted with activations: 3/4 of a byte and more work an element than a
// 4-bit one (SwiftShader 1.08-1.16 G elements/s against 1.29-1.34; lavapipe within its noise of it). Q6_K
// weights are measured against this one (bench.derive), the others against the best element rate.
// `n4` and `per_thread` count units: vec4s, or with I6 triples of vec4s.
// The benchmark keeps the best of the passes. Defines: WG, optional STRIDED, I8, I4 or I6.
struct Params {
    n4: u32,            // units in the buffer (vec4s; I6: triples of them)
    per_thread: u32,
    _pad0: u32,
    _pad1: u32,
}

#ifdef I4
#define I8
#endif
#ifdef I6
#define I8
#endif
#ifdef I8
@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<uniform> xs: array<vec4<u32>, 4>;   // int8 activations, 64 of them
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

alias Acc = vec4<i32>;                  // (see above: integer sums, activations in registers)
var<private> a: vec4<u32>;
var<private> b: vec4<u32>;
var<private> c: vec4<u32>;
var<private> d: vec4<u32>;

fn dot16(q: vec4<u32>, v: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, v.x) + dot4I8Packed(q.y, v.y) + dot4I8Packed(q.z, v.z) + dot4I8Packed(q.w, v.w);
}

fn load(i: u32) -> Acc {
#ifdef I6
    let ql0 = x[3u * i];
    let ql1 = x[3u * i + 1u];
    let h = x[3u * i + 2u];
    let lo = vec4<u32>(0x0F0F0F0Fu);
    let top = vec4<u32>(0x30303030u);
    return Acc(dot16((ql0 & lo) | ((h << vec4<u32>(4u)) & top), a), dot16((ql1 & lo) | ((h << vec4<u32>(2u)) & top), b),
               dot16(((ql0 >> vec4<u32>(4u)) & lo) | (h & top), c), dot16(((ql1 >> vec4<u32>(4u)) & lo) | ((h >> vec4<u32>(2u)) & top), d));
#else
#ifdef I4
    let w = x[i] & vec4<u32>(0x0F0F0F0Fu);
    let h = (x[i] >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    return Acc(dot4I8Packed(w.x, a.x) + dot4I8Packed(h.x, b.x), dot4I8Packed(w.y, a.y) + dot4I8Packed(h.y, b.y),
               dot4I8Packed(w.z, a.z) + dot4I8Packed(h.z, b.z), dot4I8Packed(w.w, a.w) + dot4I8Packed(h.w, b.w));
#else
    let w = x[i];
    return Acc(dot4I8Packed(w.x, a.x), dot4I8Packed(w.y, a.y), dot4I8Packed(w.z, a.z), dot4I8Packed(w.w, a.w));
#endif
#endif
}
#else
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

alias Acc = vec4<f32>;

fn load(i: u32) -> Acc {
    return x[i];
}
#endif

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var acc = Acc();
#ifdef I8
    a = xs[0];
    b = xs[1];
    c = xs[2];
    d = xs[3];
#endif
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
    y[gid.x] = f32(acc.x + acc.y + acc.z + acc.w);
}
