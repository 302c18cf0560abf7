// One cell of the KV cache: four consecutive values of a key or value row.
// KV_F16: stored as two u32s of packed halves (pack2x16float is core WGSL, so this halves the cache
// without needing shader-f16); else plain vec4<f32>. Readers and writers go through kv_unpack/kv_pack.
#ifdef KV_F16
alias KVCell = vec2<u32>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(c.x), unpack2x16float(c.y));
}
#else
alias KVCell = vec4<f32>;
fn kv_pack(x: vec4<f32>) -> KVCell {
    return x;
}
fn kv_unpack(c: KVCell) -> vec4<f32> {
    return c;
}
#endif
