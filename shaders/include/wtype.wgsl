// The block decoder of the weight type named by a W_* define (exactly one must be given).
#include "include/bytes.wgsl"
#ifdef W_F32
#include "include/f32.wgsl"
#endif
#ifdef W_F16
#include "include/f16.wgsl"
#endif
#ifdef W_Q4_0
#include "include/q4_0.wgsl"
#endif
#ifdef W_Q4_1
#include "include/q4_1.wgsl"
#endif
#ifdef W_Q5_0
#include "include/q5_0.wgsl"
#endif
#ifdef W_Q8_0
#include "include/q8_0.wgsl"
#endif
#ifdef W_Q8_0G
#include "include/q8_0g.wgsl"
#endif
#ifdef W_Q4_K
#include "include/q4_k.wgsl"
#endif
#ifdef W_Q5_K
#include "include/q5_k.wgsl"
#endif
#ifdef W_Q6_K
#include "include/q6_k.wgsl"
#endif
#ifdef W_Q6_KG
#include "include/q6_kg.wgsl"
#endif
#ifdef W_Q4_0G
#include "include/q4_0g.wgsl"
#endif
