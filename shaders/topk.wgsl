// The K largest logits of one row, in two barrier-free passes (top-k sampling reads back K pairs
// instead of the whole vocabulary): PASS1: invocation g keeps the K largest of [g*chunk, (g+1)*chunk)
// in a sorted private list and writes it to partial[g*K ..]; PASS2: one invocation merges those lists
// into result[0..K) as (value bits, index), largest first. Ties keep the lower index first (an equal
// value never passes one already listed, and candidates arrive in index order). A chunk shorter than
// K pads its list with (FLOOR, 0xffffffff). Defines: WG, K, and PASS1 or PASS2.
struct Params {
    len: u32,           // logits (PASS1) or candidate pairs (PASS2)
    chunk: u32,
    x_off: u32,
    _pad0: u32,
}

const FLOOR: f32 = -3.4028234e38;   // the lowest finite f32 (Tint refuses a literal that rounds to it from below)
const NONE: u32 = 0xffffffffu;

var<private> vals: array<f32, K>;
var<private> ids: array<u32, K>;

fn clear() {
    for (var j = 0u; j < K; j++) {
        vals[j] = FLOOR;
        ids[j] = NONE;
    }
}

fn offer(v: f32, i: u32) {
    if (!(v > vals[K - 1u])) {
        return;
    }
    var j = K - 1u;
    while (j > 0u && v > vals[j - 1u]) {
        vals[j] = vals[j - 1u];
        ids[j] = ids[j - 1u];
        j--;
    }
    vals[j] = v;
    ids[j] = i;
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
    clear();
    let end = min(start + params.chunk, params.len);
    for (var i = start; i < end; i++) {
        offer(x[params.x_off + i], i);
    }
    for (var j = 0u; j < K; j++) {
        partial[g * K + j] = vec2<u32>(bitcast<u32>(vals[j]), ids[j]);
    }
}
#endif

#ifdef PASS2
@group(0) @binding(0) var<storage, read> partial: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> result: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u) {
        return;
    }
    clear();
    for (var c = 0u; c < params.len; c++) {
        let pair = partial[c];
        if (pair.y != NONE) {
            offer(bitcast<f32>(pair.x), pair.y);
        }
    }
    for (var j = 0u; j < K; j++) {
        result[j] = vec2<u32>(bitcast<u32>(vals[j]), ids[j]);
    }
}
#endif
