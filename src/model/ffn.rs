//! SwiGLU feed-forward: `W_down · (silu(W_gate · f) ⊙ (W_up · f))`.

use super::for_rows;
use super::weights::LayerWeights;
use crate::kernels::ops::swiglu;
use crate::kernels::{matmul, matmuls};

/// `f`: `[T × d]` normed inputs; writes `[T × d]` to `out`.
pub fn forward(w: &LayerWeights, f: &[f32], n_tok: usize, out: &mut [f32]) {
    let ff = w.ffn_gate.n_out;
    let mut gate = vec![0f32; n_tok * ff]; // [T × ff]
    let mut up = vec![0f32; n_tok * ff]; // [T × ff]
    matmuls(
        f,
        n_tok,
        &mut [(&w.ffn_gate, &mut gate), (&w.ffn_up, &mut up)],
    );
    for_rows(&mut gate, ff, |t, g| {
        swiglu(g, &up[t * ff..][..ff]);
    });
    matmul(&w.ffn_down, &gate, n_tok, out);
}
