// The one C math function shaders/wasm/engine.c uses that zig's compiler_rt does not give the wasm64
// build (whose target, wasm64-freestanding, has no C library): tanhf, from zig's standard library, as
// zig's C library gives the wasm32 build (wasi) its tanhf, so the two builds round alike.
const std = @import("std");

export fn tanhf(x: f32) f32 {
    return std.math.tanh(x);
}
