// The KV cache's storage, by type, behind two readers for attention — key4(row, i) and val4(row, i):
// vec4 i of the key/value head row `row` (= slot * kv_heads + kv head) — and the cell type kv_write
// stores. They read the module's `kc` and `vc` (WGSL lets functions use module variables declared
// after them). HD4 / HDV4: vec4s per key / value head row.
//   f32 (default)  vec4<f32> cells.
//   KV_F16         vec2<u32> cells of packed halves (pack2x16float is core WGSL: no shader-f16 needed).
//   KV_Q8          u32 words; per block of 32 values along the head: 8 words of 4 int8 (byte 0 = lane x),
//                  then the block's f32 scale d (value = q * d, q = round(x / amax * 127)). Head dims
//                  must be multiples of 32.
#ifdef KV_F16
alias KVCell = vec2<u32>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(c.x), unpack2x16float(c.y));
}
#endif
#ifdef KV_Q8
alias KVCell = u32;
const Q8_WORDS: u32 = 9u;           // words per block of 32 values
fn q8_pack(q: vec4<i32>) -> u32 {
    let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}
fn q8_unpack(w: u32) -> vec4<f32> {
    // each byte shifted to the top, then arithmetic-shifted back: sign-extended int8
    let s = vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w));
    return vec4<f32>(s >> vec4<u32>(24u));
}
#endif
#ifndef KV_F16
#ifndef KV_Q8
alias KVCell = vec4<f32>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return x;
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return c;
}
#endif
#endif

#ifdef HD4
#ifdef KV_Q8
fn key4(row: u32, i: u32) -> vec4<f32> {
    let base = (row * (HD4 / 8u) + i / 8u) * Q8_WORDS;
    return q8_unpack(kc[base + i % 8u]) * bitcast<f32>(kc[base + 8u]);
}
fn val4(row: u32, i: u32) -> vec4<f32> {
    let base = (row * (HDV4 / 8u) + i / 8u) * Q8_WORDS;
    return q8_unpack(vc[base + i % 8u]) * bitcast<f32>(vc[base + 8u]);
}
#else
fn key4(row: u32, i: u32) -> vec4<f32> {
    return kv_unpack(kc[row * HD4 + i]);
}
fn val4(row: u32, i: u32) -> vec4<f32> {
    return kv_unpack(vc[row * HDV4 + i]);
}
#endif
#endif
