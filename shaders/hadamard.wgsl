// Hadamard rotation of x [n, row] (row = heads * head_dim) in groups of `width` values (a power of two
// dividing the head, at most MAXW): each group multiplied by the orthonormal Sylvester matrix H / sqrt(width),
// what a q4 cache does to scaled keys and their queries (pyshim.models.key_scales.hadamard). The group is
// turned in workgroup memory by log2(width) butterfly stages (a + b, a - b) over pairs `span` apart
// (span = 1, 2, 4, ...), then multiplied by `norm` (f32(1 / sqrt(width))): the reference's order, so the
// same bits. One workgroup per (group, token). Defines: WG.
struct Params {
    n: u32,             // tokens
    groups: u32,        // groups per token (row / width)
    width: u32,
    norm: f32,
    x_off: u32,         // element offsets
    y_off: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

const MAXW: u32 = 256u;         // pyshim.models.key_scales.MAX_ROTATION
var<workgroup> v: array<f32, MAXW>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let t = wid.y;
    let w = params.width;
    let base = (t * params.groups + g) * w;     // (the same for the whole workgroup: uniform)
    for (var i = lid; i < w; i += WG) {
        v[i] = x[params.x_off + base + i];
    }
    workgroupBarrier();
    for (var span = 1u; span < w; span *= 2u) {
        for (var i = lid; i < w / 2u; i += WG) {
            let j = i / span * 2u * span + i % span;
            let a = v[j];
            let b = v[j + span];
            v[j] = a + b;
            v[j + span] = a - b;
        }
        workgroupBarrier();
    }
    for (var i = lid; i < w; i += WG) {
        y[params.y_off + base + i] = v[i] * params.norm;
    }
}
