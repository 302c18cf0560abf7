// Rope's turn of pair p at position `pos`: (cos, sin) of pos * theta[p], scaled by mscale (rope.wgsl, and
// kv_write.wgsl's ROPE: one formula, so roped keys are the same wherever they are made). Uses the
// including kernel's `theta` and `params.mscale`.
fn rope_cs(pos: u32, p: u32) -> vec2<f32> {
    let angle = f32(pos) * theta[p];
    return vec2<f32>(cos(angle) * params.mscale, sin(angle) * params.mscale);
}
