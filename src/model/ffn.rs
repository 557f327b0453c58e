//! SwiGLU feed-forward: `W_down · (silu(W_gate · f) ⊙ (W_up · f))`.

use super::weights::LayerWeights;
use super::{carve, for_rows};
use crate::kernels::ops::swiglu;
use crate::kernels::{matmul, matmuls};

/// `f`: `[T × d]` normed inputs; writes `[T × d]` to `out`. Buffers come from `arena` (see `Scratch`).
pub fn forward(w: &LayerWeights, f: &[f32], n_tok: usize, out: &mut [f32], arena: &mut Vec<f32>) {
    let ff = w.ffn_gate.n_out;
    let [gate, up] = carve(arena, [n_tok * ff, n_tok * ff]); // [T × ff] each
    matmuls(
        f,
        n_tok,
        &mut [(&w.ffn_gate, &mut *gate), (&w.ffn_up, &mut *up)],
    );
    for_rows(gate, ff, |t, g| {
        swiglu(g, &up[t * ff..][..ff]);
    });
    matmul(&w.ffn_down, gate, n_tok, out);
}
