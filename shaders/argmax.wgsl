// Greedy sampling on the GPU in two barrier-free passes over logits [len]:
// PASS1: invocation g scans [g*chunk, (g+1)*chunk) and writes (max, index) to partial[g];
// PASS2: one invocation scans the partials and writes the winning index to result[0].
// Ties go to the lowest index (as numpy.argmax). Defines: WG and PASS1 or PASS2.
struct Params {
    len: u32,           // logits (PASS1) or partials (PASS2)
    chunk: u32,
    x_off: u32,
    _pad0: u32,
}

#ifdef PASS1
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> partial: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = gid.x;
    let start = g * params.chunk;
    if (start >= params.len) {
        return;
    }
    let end = min(start + params.chunk, params.len);
    var best = x[params.x_off + start];
    var best_i = start;
    for (var i = start + 1u; i < end; i++) {
        let v = x[params.x_off + i];
        if (v > best) {
            best = v;
            best_i = i;
        }
    }
    partial[g] = vec2<u32>(bitcast<u32>(best), best_i);
}
#endif

#ifdef PASS2
@group(0) @binding(0) var<storage, read> partial: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> result: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u) {
        return;
    }
    var best = bitcast<f32>(partial[0].x);
    var best_i = partial[0].y;
    for (var g = 1u; g < params.len; g++) {
        let v = bitcast<f32>(partial[g].x);
        if (v > best) {
            best = v;
            best_i = partial[g].y;
        }
    }
    result[0] = best_i;
}
#endif
