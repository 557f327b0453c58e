//! SwiGLU feed-forward: `W_down · (silu(W_gate · f) ⊙ (W_up · f))`.

use super::weights::LayerWeights;
use super::{for_rows, grow};
use crate::kernels::ops::swiglu;
use crate::kernels::{matmul, matmuls};

/// The FFN's activation buffers (see [`super::Scratch`]).
#[derive(Default)]
pub struct Scratch {
    gate: Vec<f32>,
    up: Vec<f32>,
}

/// `f`: `[T × d]` normed inputs; writes `[T × d]` to `out`.
pub fn forward(w: &LayerWeights, f: &[f32], n_tok: usize, out: &mut [f32], s: &mut Scratch) {
    let ff = w.ffn_gate.n_out;
    let gate = grow(&mut s.gate, n_tok * ff); // [T × ff]
    let up = grow(&mut s.up, n_tok * ff); // [T × ff]
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
