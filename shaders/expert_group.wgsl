// A step's (token, slot) pairs grouped by expert, for the expert matvecs of a prompt (matvec_i8 GROUPED):
// table[e] = where expert e's pairs start (table[experts] = pairs), then table[experts + 1 + j] = the
// pairs in expert order (stable: ascending pair within an expert). A counting sort in one invocation:
// a prompt step has at most a few thousand pairs, and the pass reads 4 bytes a pair.
// Defines: WG.
struct Params {
    pairs: u32,
    experts: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> table: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

const MAX_EXPERTS: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u) {
        return;
    }
    var counts: array<u32, MAX_EXPERTS>;
    for (var p = 0u; p < params.pairs; p++) {
        counts[ids[p]] += 1u;
    }
    var at = 0u;
    for (var e = 0u; e < params.experts; e++) {
        table[e] = at;
        let c = counts[e];
        counts[e] = at;             // from here on: expert e's next free place
        at += c;
    }
    table[params.experts] = at;
    for (var p = 0u; p < params.pairs; p++) {
        let e = ids[p];
        table[params.experts + 1u + counts[e]] = p;
        counts[e] += 1u;
    }
}
