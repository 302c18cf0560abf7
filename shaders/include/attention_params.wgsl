// The uniform params of attention.wgsl and attention_prefill.wgsl (kernels.PARAMS["attention"]).
struct Params {
    n: u32,             // query tokens
    heads: u32,
    kv_heads: u32,
    cap: u32,           // slots in the cache ring
    window: u32,        // 0: attend to every earlier position
    scale: f32,
    softcap: f32,
    pos_off: u32,
    q_off: u32,         // element offsets (multiples of 4)
    out_off: u32,
    row_words: u32,     // QUANT: u32 words per token row of the quantized output (quantize.wgsl's row_words)
    _pad1: u32,
}
