"""The ops interface: everything a model's forward pass may do, and nothing else.

A model (`pyshim/models/<arch>.py`) is written once against `Ops`. Two executors implement it:
- the reference executor (`pyshim/exec/reference.py`, NumPy) computes each op immediately;
- the GPU executor records each op as a dispatch into a program, once per shape (decode step,
  prefill chunk), and replays it per step.

So the rules for model code are:
- tensors are opaque handles: the model passes them from op to op and reads only `.shape`
  (a tuple of ints); it never indexes them, converts them, or calls NumPy on them;
- every op's output shape is a function of its input shapes and arguments (given below), so a recorder
  knows every buffer size before anything runs;
- no control flow on values — only on shapes and hyperparameters; the step's token ids and positions
  arrive as handles (`tokens`, `positions`, both `[n]`) made by the executor;
- weights are bound once, by GGUF tensor name and expected shape, through `weight()`; the handle is
  whatever the executor wants (quant blocks in a GPU buffer, a lazily dequantized array...).

Activations are `[n, features]` (n tokens of the step) or `[n, heads, head_dim]`, float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from pyshim.models.rope import RopeSpec

Tensor = Any    # an executor's activation handle; has `.shape`
Weight = Any    # an executor's weight handle; has `.shape` (NumPy order: (n_out, n_in) for matmuls)

ACTIVATIONS = ("silu", "gelu_tanh")
GATINGS = ("softmax", "sigmoid")        # how a router turns its logits into expert weights


@dataclass(frozen=True)
class AttnSpec:
    """One layer's attention: everything the kernel needs besides q, k, v."""

    layer: int                  # index of the layer's KV cache
    n_heads: int
    n_kv_heads: int             # GQA: query head h reads KV head h // (n_heads // n_kv_heads)
    head_dim: int               # of q and k
    head_dim_v: int
    scale: float                # multiplies q·k before softcap and softmax
    window: int = 0             # sliding window: key p visible from query q iff 0 <= q - p < window (0: all)
    softcap: float = 0.0        # scores -> softcap * tanh(scores / softcap) when > 0


@dataclass(frozen=True)
class RouterSpec:
    """One mixture-of-experts layer's router: which experts each token goes to, and with what weight.
    probs = gating(logits); the `n_used` largest probs pick the experts; their probs are the weights,
    divided by their sum when `norm`, then multiplied by `scale` (llama.cpp's build_moe_ffn)."""

    n_experts: int
    n_used: int
    gating: str = "softmax"     # one of GATINGS
    norm: bool = False
    scale: float = 1.0


class Ops(Protocol):
    # --- weights (load time) ---
    def weight(self, name: str, shape: Sequence[int]) -> Weight:
        """Bind GGUF tensor `name`; raise MissingTensorError / TensorShapeError / UnsupportedError (its type)."""
        ...

    def weights(self, named: Sequence[tuple[str, Sequence[int]]]) -> list[Weight]:
        """Bind several weights the model multiplies by the same input (q, k and v; gate and up), each as
        `weight` would; an executor may keep their rows together so that `matmuls` / `glu_matmul` read them
        in one pass."""
        ...

    def has_weight(self, name: str) -> bool:
        """Whether the file holds `name` (optional tensors: biases, a separate output head)."""
        ...

    def scalar(self, name: str) -> float:
        """The value of a one-element weight, read at load (gemma4's `layer_output_scale`: then a `scale`)."""
        ...

    # --- ops (shape rules in the docstrings) ---
    def embed(self, table: Weight, tokens: Tensor) -> Tensor:
        """Rows of `table` [vocab, d] picked by `tokens` [n] -> [n, d]."""
        ...

    def matmul(self, x: Tensor, w: Weight, bias: Weight | None = None, residual: Tensor | None = None) -> Tensor:
        """x [n, k] times w [m, k] transposed (+ bias [m]) (+ residual [n, m]: a skip connection, added in
        the same pass where the executor can) -> [n, m]."""
        ...

    def matmuls(self, x: Tensor, ws: Sequence[Weight], biases: Sequence[Weight | None]) -> list[Tensor]:
        """x times each of `ws` (+ its bias): [matmul(x, w, b) for w, b in zip(ws, biases)], where the
        executor may run weights bound together by `weights` as one matmul."""
        ...

    def glu_matmul(self, x: Tensor, gate: Weight, up: Weight, act: str) -> Tensor:
        """glu(matmul(x, gate), matmul(x, up), act): a gated feed-forward's first half, which an executor
        may run as one matmul with the activation in its epilogue; gate, up [f, k] -> [n, f]."""
        ...

    def rmsnorm(self, x: Tensor, w: Weight | None, eps: float, residual: Tensor | None = None) -> Tensor:
        """x / rms(x) * w over the last dim (+ residual, x's shape: gemma3's post-norms end in the skip
        connection); x [..., d], w [d] or None (no weight: gemma4's values) -> x's shape."""
        ...

    def view(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """The same elements in another row-major shape (no copy where the executor can avoid one)."""
        ...

    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        """x [n, sum(sizes)] cut along the last dim -> [n, sizes[i]] each (fused qkv, fused gate/up)."""
        ...

    def rope(self, x: Tensor, positions: Tensor, spec: RopeSpec, freq_factors: Weight | None = None,
             scale: np.ndarray | None = None, rotation: int = 0) -> Tensor:
        """Rotate the first `spec.dims` of each head; x [n, heads, head_dim], positions [n] -> x's shape.
        `freq_factors` [dims/2] (Llama 3.1's `rope_freqs.weight`) divide each pair's angle. `scale`
        [heads, head_dim] f32, a constant made at load (pyshim.models.key_scales): the rotated heads are
        then multiplied by it, element by element (f32); with `rotation` each group of that many values
        (a power of two dividing head_dim, at most 256) then multiplied by the orthonormal Hadamard matrix,
        as pyshim.models.key_scales.hadamard computes it (a q4 cache's keys and queries)."""
        ...

    def attention(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, spec: AttnSpec) -> Tensor:
        """Store k, v in layer `spec.layer`'s KV cache at `positions`, then attend: each query sees the keys
        at positions <= its own (and within the window), including this step's.
        q [n, n_heads, head_dim], k [n, n_kv_heads, head_dim], v [n, n_kv_heads, head_dim_v]
        -> [n, n_heads * head_dim_v]."""
        ...

    def glu(self, gate: Tensor, up: Tensor, act: str) -> Tensor:
        """act(gate) * up, act in ACTIVATIONS; gate, up [n, f] -> [n, f]."""
        ...

    # --- mixture of experts: the router's choice stays an executor tensor (data, not control flow) ---
    def route(self, logits: Tensor, spec: RouterSpec, scales: Weight | None = None) -> tuple[Tensor, Tensor]:
        """The router: logits [n, n_experts] -> (weights [n, n_used] f32, ids [n, n_used] expert indices),
        each token's experts in descending order of probability (ties: the lower index first). `scales`
        [n_experts] (gemma4's `ffn_down_exps.scale`): each weight then multiplied by its expert's scale."""
        ...

    def guess_route(self, x: Tensor, gate_inp: Weight, spec: RouterSpec) -> None:
        """A guess at a later MoE layer's experts: that layer's router (`gate_inp` [n_experts, d], `spec`)
        applied to this layer's router input x [n, d]. Changes no result: an executor that streams experts
        from the store fetches the guessed ones early (pyshim.gpu.expert_cache); the others ignore it."""
        ...

    def expert_matmul(self, x: Tensor, w: Weight, ids: Tensor) -> Tensor:
        """Each (token, slot) pair's chosen expert: w [n_experts, m, k] (a 3-D GGUF tensor), ids [n, u];
        x [n, k] (each token's row for all of its u experts) or [n * u, k] (a row per pair)
        -> [n * u, m], pair (t, j) at row t * u + j, times expert ids[t, j]'s matrix."""
        ...

    def expert_sum(self, y: Tensor, weights: Tensor) -> Tensor:
        """Each token's experts' outputs weighted and summed in slot order: y [n * u, d], weights [n, u] -> [n, d]."""
        ...

    def sigmoid_gate(self, x: Tensor, g: Tensor) -> Tensor:
        """x * sigmoid(g), one gate per row: x [n, d], g [n, 1] -> [n, d] (Qwen2-MoE's shared expert)."""
        ...

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise, same shapes (residual connections)."""
        ...

    def scale(self, x: Tensor, s: float) -> Tensor:
        """x * s."""
        ...

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """cap * tanh(x / cap) (Gemma's final logit softcapping)."""
        ...

    def last(self, x: Tensor) -> Tensor:
        """The last row: x [n, d] -> [1, d] (only the last position's logits are needed when generating)."""
        ...
