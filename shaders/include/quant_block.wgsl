// One block of activations -> int8 words and f32 metadata, rounded exactly as llama.cpp's CPU backend rounds
// them (quantize.wgsl's layout; the attention kernel's QUANT output uses it too). Writes the including
// kernel's `xq: array<u32>`. Q8_K: blocks of 256 (the k-quants'), else blocks of 32 (Q8_0/Q8_1).
#include "include/exact.wgsl"
#ifdef Q8_K
const QBLOCK: u32 = 256u;
const META_WORDS: u32 = 20u;
#else
const QBLOCK: u32 = 32u;
const META_WORDS: u32 = 4u;
#endif
const QVEC4: u32 = QBLOCK / 4u;

// v: the block's values; its QVEC4 words of int8 go to xq[words..], its metadata to xq[info..]
fn quant_block(v: ptr<function, array<vec4<f32>, QVEC4>>, words: u32, info: u32) {
#ifdef Q8_K
    // the first element of largest magnitude, with its sign
    var amax = 0.0;
    var biggest = 0.0;
    for (var i = 0u; i < QVEC4; i++) {
        let x = (*v)[i];
        for (var c = 0u; c < 4u; c++) {
            if (abs(x[c]) > amax) {
                amax = abs(x[c]);
                biggest = x[c];
            }
        }
    }
    var iscale = 0.0;
    var d = 0.0;
    if (amax != 0.0) {
        iscale = -127.0 / biggest;
        d = 1.0 / iscale;
    }
    xq[info] = bitcast<u32>(d);
    xq[info + 1u] = 0u;
    xq[info + 2u] = 0u;
    xq[info + 3u] = 0u;
    for (var g = 0u; g < 16u; g++) {
        var sum = 0i;
        for (var i = 0u; i < 4u; i++) {
            let iv = vec4<i32>(min(vec4<f32>(127.0), round(iscale * (*v)[4u * g + i])));
            sum += iv.x + iv.y + iv.z + iv.w;
            xq[words + 4u * g + i] = pack4xI8(iv);
        }
        xq[info + 4u + g] = bitcast<u32>(f32(sum));
    }
#else
    var amax = 0.0;
    for (var i = 0u; i < QVEC4; i++) {
        let a = abs((*v)[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    var inv = 0.0;
    if (amax != 0.0) {
        inv = 127.0 / amax;
    }
    let d = amax / 127.0;
    var sum = 0i;
    for (var i = 0u; i < QVEC4; i++) {
        let iv = vec4<i32>(round((*v)[i] * inv));
        sum += iv.x + iv.y + iv.z + iv.w;
        xq[words + i] = pack4xI8(iv);
    }
    // Q8_0 keeps d as f16, Q8_1 also s
    xq[info] = bitcast<u32>(round_f16(d));
    xq[info + 1u] = bitcast<u32>(round_f16(d * f32(sum)));
    xq[info + 2u] = bitcast<u32>(f32(sum));
    xq[info + 3u] = 0u;
#endif
}
