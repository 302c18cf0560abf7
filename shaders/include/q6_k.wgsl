// Q6_K, 210 B: ql[128] low 4 bits | qh[64] high 2 bits | scales[16] int8 | d f16. Two halves of 128:
// half n uses ql[64n..], qh[32n..], scales[8n..]; for l < 32, with 2-bit fields s of qh[l]:
// element 128n+l = lo(ql[l]) | s0<<4, +32: lo(ql[l+32]) | s1<<4, +64: hi(ql[l]) | s2<<4,
// +96: hi(ql[l+32]) | s3<<4, each minus 32, times d*scales[8n + l/16 + 2*(which)].
// Blocks start 2 bytes into a word every other block: every field is read through two-word windows
// (`sh` is the same for all of them: their offsets in the block are multiples of 4).
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn block_apply(wb: u32, base: u32, acc: ptr<function, Acc>) {
    let i0 = wb >> 2u;
    let sh = (wb & 3u) * 8u;
    let d = w_f16(wb + 208u);
    let sw = vec4<u32>(funnel(w[i0 + 48u], w[i0 + 49u], sh), funnel(w[i0 + 49u], w[i0 + 50u], sh),
                       funnel(w[i0 + 50u], w[i0 + 51u], sh), funnel(w[i0 + 51u], w[i0 + 52u], sh));
    for (var n = 0u; n < 2u; n++) {
        var lo_a = w[i0 + 16u * n];             // ql[64n..]
        var lo_b = w[i0 + 16u * n + 8u];        // ql[64n+32..]
        var lo_h = w[i0 + 32u + 8u * n];        // qh[32n..]
        for (var i = 0u; i < 8u; i++) {
            let hi_a = w[i0 + 16u * n + i + 1u];
            let hi_b = w[i0 + 16u * n + 8u + i + 1u];
            let hi_h = w[i0 + 32u + 8u * n + i + 1u];
            let a = funnel(lo_a, hi_a, sh);
            let b = funnel(lo_b, hi_b, sh);
            let h = funnel(lo_h, hi_h, sh);
            lo_a = hi_a;
            lo_b = hi_b;
            lo_h = hi_h;
            let k = 8u * n + (i >> 2u);
            let sc = d * vec4<f32>(vec4<i32>(
                bitcast<i32>(byte_of(sw, k) << 24u) >> 24u, bitcast<i32>(byte_of(sw, k + 2u) << 24u) >> 24u,
                bitcast<i32>(byte_of(sw, k + 4u) << 24u) >> 24u, bitcast<i32>(byte_of(sw, k + 6u) << 24u) >> 24u));
            let e = base + 128u * n + 4u * i;
            // the 6-bit values, one per byte, built in scalar registers
            let v1 = (a & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4u);
            let v2 = (b & 0x0F0F0F0Fu) | (((h >> 2u) & 0x03030303u) << 4u);
            let v3 = ((a >> 4u) & 0x0F0F0F0Fu) | (((h >> 4u) & 0x03030303u) << 4u);
            let v4 = ((b >> 4u) & 0x0F0F0F0Fu) | (((h >> 6u) & 0x03030303u) << 4u);
            sink(sc.x * (u8x4(v1) - 32.0), e, acc);
            sink(sc.y * (u8x4(v2) - 32.0), e + 32u, acc);
            sink(sc.z * (u8x4(v3) - 32.0), e + 64u, acc);
            sink(sc.w * (u8x4(v4) - 32.0), e + 96u, acc);
        }
    }
}
