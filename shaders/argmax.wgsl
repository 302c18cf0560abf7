// Greedy sampling on the GPU in two barrier-free passes over logits [rows, len], a row per grid y (the
// rows of a batched decode step, one per sequence; one row otherwise):
// PASS1: invocation g scans [g*chunk, (g+1)*chunk) of its row and writes (max, index) to its row's partial[g];
// PASS2: one invocation a row scans the row's partials and writes the winning index to result[row].
// Ties go to the lowest index (as numpy.argmax). Defines: WG and PASS1 or PASS2.
// SUBGROUP (real GPUs with subgroups): PASS1 gives each workgroup a chunk (read coalesced) and PASS2 one
// workgroup the partials, the best of a workgroup found by subgroupMax/subgroupMin (see workgroup_best).
#ifdef SUBGROUP
#enable subgroups
#endif
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
#endif
#ifdef PASS2
@group(0) @binding(0) var<storage, read> partial: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> result: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;
#endif

#ifdef SUBGROUP
const FLOOR: f32 = -3.4028234e38;   // the lowest finite f32: what an invocation without candidates holds
const NONE: u32 = 0xffffffffu;
var<workgroup> slots: array<vec2<u32>, WG>;     // (value bits, index) per subgroup: enough for any size

// v beats (best, best_i): larger, or equal with a lower index
fn beats(v: f32, i: u32, best: f32, best_i: u32) -> bool {
    return v > best || (v == best && i < best_i);
}

// The workgroup's best of every invocation's (v, i): the subgroup's largest value and the lowest index
// holding it, one slot per subgroup, then every invocation scans the n_sg slots. Values below FLOOR
// (-inf) count as FLOOR, so an invocation without candidates (FLOOR, NONE) loses every tie.
fn workgroup_best(v: f32, i: u32, lane: u32, sg: u32, n_sg: u32) -> vec2<u32> {
    let top = subgroupMax(v);
    let top_i = subgroupMin(select(NONE, i, v == top));
    if (lane == 0u) {
        slots[sg] = vec2<u32>(bitcast<u32>(top), top_i);
    }
    workgroupBarrier();
    var best = bitcast<f32>(slots[0].x);
    var best_i = slots[0].y;
    for (var s = 1u; s < n_sg; s++) {
        if (beats(bitcast<f32>(slots[s].x), slots[s].y, best, best_i)) {
            best = bitcast<f32>(slots[s].x);
            best_i = slots[s].y;
        }
    }
    return vec2<u32>(bitcast<u32>(best), best_i);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
#ifdef PASS1
    // workgroup g: logits [g*chunk, (g+1)*chunk) of row wid.y, invocation lid every WG-th of them
    let start = wid.x * params.chunk;
    let end = min(start + params.chunk, params.len);
    let row_x = params.x_off + wid.y * params.len;
    var best = FLOOR;
    var best_i = NONE;
    for (var i = start + lid.x; i < end; i += WG) {
        let v = max(x[row_x + i], FLOOR);
        if (beats(v, i, best, best_i)) {
            best = v;
            best_i = i;
        }
    }
    let won = workgroup_best(best, best_i, lane, sg, n_sg);
    if (lid.x == 0u && start < params.len) {
        partial[wid.y * ((params.len + params.chunk - 1u) / params.chunk) + wid.x] = won;
    }
#endif
#ifdef PASS2
    var best = FLOOR;
    var best_i = NONE;
    let row_p = wid.y * params.len;
    for (var g = lid.x; g < params.len; g += WG) {
        let v = bitcast<f32>(partial[row_p + g].x);
        if (beats(v, partial[row_p + g].y, best, best_i)) {
            best = v;
            best_i = partial[row_p + g].y;
        }
    }
    let won = workgroup_best(best, best_i, lane, sg, n_sg);
    if (lid.x == 0u) {
        result[wid.y] = won.y;
    }
#endif
}
#else
#ifdef PASS1
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = gid.x;
    let start = g * params.chunk;
    if (start >= params.len) {
        return;
    }
    let end = min(start + params.chunk, params.len);
    let row_x = params.x_off + gid.y * params.len;
    var best = x[row_x + start];
    var best_i = start;
    for (var i = start + 1u; i < end; i++) {
        let v = x[row_x + i];
        if (v > best) {
            best = v;
            best_i = i;
        }
    }
    partial[gid.y * ((params.len + params.chunk - 1u) / params.chunk) + g] = vec2<u32>(bitcast<u32>(best), best_i);
}
#endif

#ifdef PASS2
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u) {
        return;
    }
    let row_p = gid.y * params.len;
    var best = bitcast<f32>(partial[row_p].x);
    var best_i = partial[row_p].y;
    for (var g = 1u; g < params.len; g++) {
        let v = bitcast<f32>(partial[row_p + g].x);
        if (v > best) {
            best = v;
            best_i = partial[row_p + g].y;
        }
    }
    result[gid.y] = best_i;
}
#endif
#endif
