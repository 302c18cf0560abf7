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
    _pad0: u32,
    _pad1: u32,
}
