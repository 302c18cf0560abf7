// The KV cache's storage, by type, behind two readers for attention — key4(row, i) and val4(row, i):
// vec4 i of the key/value head row `row` (= slot * kv_heads + kv head) — and the cell type kv_write
// stores. They read the module's `kc` and `vc` (WGSL lets functions use module variables declared
// after them). HD4 / HDV4: vec4s per key / value head row. The block types define KV_BLOCKED and KV_WORDS
// (u32 words a block of 32 values takes).
// Where a key is: the cache is in pages of KV_PAGE positions (pyshim.gpu.kv). The step map (the kernel's
// `positions`) holds each token's sequence at seq_off and the layer's page table at table_off: a row of
// table_len pages per sequence, position j in page (j / KV_PAGE) % table_len of the row (a sliding-window
// layer's ring wraps there), at j % KV_PAGE in it.
const KV_PAGE: u32 = 16u;

// where token t's sequence's row of the page table starts in the step map
fn page_row(t: u32) -> u32 {
    return params.table_off + positions[params.seq_off + params.pos_off + t] * params.table_len;
}

// the slot (position row of the pool) of key position j of the sequence whose row starts at `row`
fn kv_slot(row: u32, j: u32) -> u32 {
    return positions[row + (j / KV_PAGE) % params.table_len] * KV_PAGE + j % KV_PAGE;
}
//   f32 (default)  vec4<f32> cells.
//   KV_F16         vec2<u32> cells of packed halves (pack2x16float is core WGSL: no shader-f16 needed).
//   KV_Q8          u32 words; per block of 32 values along the head: 8 words of 4 int8 (byte 0 = lane x),
//                  then the block's f32 scale d (value = q * d, q = round(x / amax * 127)). Head dims
//                  must be multiples of 32.
//   KV_Q4          u32 words; per block of 32 values along the head: 4 words of 8 nibbles (value 8w+n in
//                  bits 4n..4n+3 of word w), then the block's f32 scale d (value = (q - 8) * d, llama.cpp's
//                  q4_0 rounding: d = -m / 8 for the block's largest-magnitude value m). Head dims: multiples of 32.
#ifdef KV_F16
#ifdef F16
// with shader-f16 the same 8 bytes a cell are read as halves (kv_write stores them packed, as below)
alias KVCell = vec4<f16>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return KVCell(x);
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return vec4<f32>(c);
}
#else
alias KVCell = vec2<u32>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(c.x), unpack2x16float(c.y));
}
#endif
#endif
#ifdef KV_Q8
alias KVCell = u32;
#define KV_BLOCKED
const KV_WORDS: u32 = 9u;           // words per block of 32 values
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
#ifdef KV_Q4
alias KVCell = u32;
#define KV_BLOCKED
const KV_WORDS: u32 = 5u;           // words per block of 32 values
// the 4 nibbles of half `h` (0: low 16 bits) of word w, as q - 8
fn q4_unpack(w: u32, h: u32) -> vec4<f32> {
    let s = w >> (h * 16u);
    return vec4<f32>(vec4<u32>(s, s >> 4u, s >> 8u, s >> 12u) & vec4<u32>(0xfu)) - vec4<f32>(8.0);
}
#endif
#ifndef KV_F16
#ifndef KV_Q8
#ifndef KV_Q4
alias KVCell = vec4<f32>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return x;
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return c;
}
#endif
#endif
#endif

#ifdef HD4
#ifdef KV_Q8
fn key4(row: u32, i: u32) -> vec4<f32> {
    let base = (row * (HD4 / 8u) + i / 8u) * KV_WORDS;
    return q8_unpack(kc[base + i % 8u]) * bitcast<f32>(kc[base + 8u]);
}
fn val4(row: u32, i: u32) -> vec4<f32> {
    let base = (row * (HDV4 / 8u) + i / 8u) * KV_WORDS;
    return q8_unpack(vc[base + i % 8u]) * bitcast<f32>(vc[base + 8u]);
}
#endif
#ifdef KV_Q4
fn key4(row: u32, i: u32) -> vec4<f32> {
    let base = (row * (HD4 / 8u) + i / 8u) * KV_WORDS;
    return q4_unpack(kc[base + i % 8u / 2u], i % 2u) * bitcast<f32>(kc[base + 4u]);
}
fn val4(row: u32, i: u32) -> vec4<f32> {
    let base = (row * (HDV4 / 8u) + i / 8u) * KV_WORDS;
    return q4_unpack(vc[base + i % 8u / 2u], i % 2u) * bitcast<f32>(vc[base + 4u]);
}
#endif
#ifndef KV_Q8
#ifndef KV_Q4
fn key4(row: u32, i: u32) -> vec4<f32> {
    return kv_unpack(kc[row * HD4 + i]);
}
fn val4(row: u32, i: u32) -> vec4<f32> {
    return kv_unpack(vc[row * HDV4 + i]);
}
#endif
#endif
#ifdef F16
// F16 (shader-f16): a key as halves; an f16 cache's cells are halves already (no unpacking)
fn key4h(row: u32, i: u32) -> vec4<f16> {
#ifdef KV_F16
    return kc[row * HD4 + i];
#else
    return vec4<f16>(key4(row, i));
#endif
}
#endif
#endif
