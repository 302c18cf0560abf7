// The uniform params of attention.wgsl and attention_prefill.wgsl (kernels.PARAMS["attention"]).
struct Params {
    n: u32,             // query tokens
    heads: u32,
    kv_heads: u32,
    table_len: u32,     // pages in a sequence's row of the page table (include/kv.wgsl kv_slot)
    window: u32,        // 0: attend to every earlier position
    scale: f32,
    softcap: f32,
    pos_off: u32,
    q_off: u32,         // element offsets (multiples of 4)
    out_off: u32,
    row_words: u32,     // QUANT: u32 words per token row of the quantized output (quantize.wgsl's row_words)
    seq_off: u32,       // word offsets in the step map (`positions`) of each token's sequence
    table_off: u32,     // and of the layer's page table
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
