//! llama-quantize's ftype recipes: which ggml type each tensor gets (spec gguf-and-quants §6).

use crate::quant::GgmlType;

/// A llama "ftype": the mixture of tensor types a quantized file is made with (`general.file_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
}

impl FileType {
    pub const ALL: [FileType; 17] = [
        FileType::F32,
        FileType::F16,
        FileType::BF16,
        FileType::Q4_0,
        FileType::Q4_1,
        FileType::Q5_0,
        FileType::Q5_1,
        FileType::Q8_0,
        FileType::Q2_K,
        FileType::Q3_K_S,
        FileType::Q3_K_M,
        FileType::Q3_K_L,
        FileType::Q4_K_S,
        FileType::Q4_K_M,
        FileType::Q5_K_S,
        FileType::Q5_K_M,
        FileType::Q6_K,
    ];

    /// The `general.file_type` id (`llama_ftype`).
    pub fn id(self) -> u32 {
        match self {
            FileType::F32 => 0,
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q4_1 => 3,
            FileType::Q8_0 => 7,
            FileType::Q5_0 => 8,
            FileType::Q5_1 => 9,
            FileType::Q2_K => 10,
            FileType::Q3_K_S => 11,
            FileType::Q3_K_M => 12,
            FileType::Q3_K_L => 13,
            FileType::Q4_K_S => 14,
            FileType::Q4_K_M => 15,
            FileType::Q5_K_S => 16,
            FileType::Q5_K_M => 17,
            FileType::Q6_K => 18,
            FileType::BF16 => 32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileType::F32 => "F32",
            FileType::F16 => "F16",
            FileType::BF16 => "BF16",
            FileType::Q4_0 => "Q4_0",
            FileType::Q4_1 => "Q4_1",
            FileType::Q5_0 => "Q5_0",
            FileType::Q5_1 => "Q5_1",
            FileType::Q8_0 => "Q8_0",
            FileType::Q2_K => "Q2_K",
            FileType::Q3_K_S => "Q3_K_S",
            FileType::Q3_K_M => "Q3_K_M",
            FileType::Q3_K_L => "Q3_K_L",
            FileType::Q4_K_S => "Q4_K_S",
            FileType::Q4_K_M => "Q4_K_M",
            FileType::Q5_K_S => "Q5_K_S",
            FileType::Q5_K_M => "Q5_K_M",
            FileType::Q6_K => "Q6_K",
        }
    }

    /// Parses a name as llama-quantize accepts it ("Q4_K_M", "q8_0", "f16"); "Q4_K"/"Q5_K"/"Q3_K" mean the _M mixes.
    pub fn from_name(name: &str) -> Option<FileType> {
        let upper = name.to_ascii_uppercase();
        let alias = match upper.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            other => other,
        };
        FileType::ALL.into_iter().find(|f| f.name() == alias)
    }

    /// The type of every quantizable tensor that no rule singles out.
    pub fn default_type(self) -> GgmlType {
        match self {
            FileType::F32 => GgmlType::F32,
            FileType::F16 => GgmlType::F16,
            FileType::BF16 => GgmlType::BF16,
            FileType::Q4_0 => GgmlType::Q4_0,
            FileType::Q4_1 => GgmlType::Q4_1,
            FileType::Q5_0 => GgmlType::Q5_0,
            FileType::Q5_1 => GgmlType::Q5_1,
            FileType::Q8_0 => GgmlType::Q8_0,
            FileType::Q2_K => GgmlType::Q2_K,
            FileType::Q3_K_S | FileType::Q3_K_M | FileType::Q3_K_L => GgmlType::Q3_K,
            FileType::Q4_K_S | FileType::Q4_K_M => GgmlType::Q4_K,
            FileType::Q5_K_S | FileType::Q5_K_M => GgmlType::Q5_K,
            FileType::Q6_K => GgmlType::Q6_K,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, FileType::F32 | FileType::F16 | FileType::BF16)
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether llama-quantize would quantize this tensor at all (`tensor_allows_quantization`).
/// `n_dims` is ggml's count: trailing dimensions of size 1 do not count.
pub fn is_quantizable(name: &str, ne: &[u64]) -> bool {
    const NEVER: [&str; 12] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        ".position_embd",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
    ];
    let n_dims = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && name.ends_with("weight")
        && !NEVER.iter().any(|p| name.contains(p))
        && !name.contains("time_mix_")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnVLike,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" || name.contains("per_layer_token_embd.weight") {
        Category::TokenEmbd
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        Category::AttnVLike
    } else if name.contains("attn_output.weight") {
        Category::AttnOutput
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third in between.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Per-file state of the recipe: the running counters llama-quantize keeps while it walks the tensors
/// in its order (by layer number, then name; see [`sort_like_llama_quantize`]).
pub struct Recipe {
    pub ftype: FileType,
    pub pure: bool,
    n_layer: i64,
    n_gqa: u64,
    has_output: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
}

impl Recipe {
    /// `names` are all tensor names of the model; `n_layer` is `block_count`; `n_gqa` = heads / kv heads of layer 0.
    pub fn new<'a>(
        ftype: FileType,
        pure: bool,
        names: impl Iterator<Item = &'a str>,
        n_layer: u64,
        n_gqa: u64,
    ) -> Recipe {
        let (mut has_output, mut n_attention_wv) = (false, 0);
        for n in names {
            has_output |= n == "output.weight";
            n_attention_wv += (category(n) == Category::AttnVLike) as i64;
        }
        Recipe {
            ftype,
            pure,
            n_layer: n_layer as i64,
            n_gqa,
            has_output,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
        }
    }

    /// The type for the next tensor, or `None` if it is copied unchanged. Call in llama-quantize's order.
    pub fn choose(&mut self, name: &str, ne: &[u64]) -> Option<GgmlType> {
        if !is_quantizable(name, ne) {
            return None;
        }
        let default = self.ftype.default_type();
        let mut ty = if self.pure || self.ftype.is_float() {
            default
        } else {
            self.mixture(name, ne, default)
        };
        // Counters advance whether or not the mixture was applied.
        match category(name) {
            Category::AttnVLike => self.i_attention_wv += 1,
            Category::FfnDown => self.i_ffn_down += 1,
            _ => {}
        }
        ty = fallback(ty, ne[0]);
        Some(ty)
    }

    fn mixture(&self, name: &str, ne: &[u64], default: GgmlType) -> GgmlType {
        use FileType as F;
        use GgmlType as T;
        let ft = self.ftype;
        let mut cat = category(name);
        if cat == Category::TokenEmbd && !self.has_output {
            cat = Category::Output; // tied embeddings double as the LM head
        }
        match cat {
            Category::Output => {
                if !ne[0].is_multiple_of(default.block_size() as u64) {
                    T::Q8_0
                } else if default != T::Q8_0 {
                    T::Q6_K
                } else {
                    default
                }
            }
            Category::TokenEmbd => default,
            Category::AttnVLike => {
                let (i, n) = (self.i_attention_wv, self.n_attention_wv);
                match ft {
                    F::Q2_K => {
                        if self.n_gqa >= 4 {
                            T::Q4_K
                        } else {
                            T::Q3_K
                        }
                    }
                    F::Q3_K_M => {
                        if i < 2 {
                            T::Q5_K
                        } else {
                            T::Q4_K
                        }
                    }
                    F::Q3_K_L => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::Q4_K_S if i < 4 => T::Q5_K,
                    _ => default,
                }
            }
            Category::AttnOutput => match ft {
                F::Q2_K => T::Q3_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                _ => default,
            },
            Category::FfnDown => {
                let (i, n) = (self.i_ffn_down, self.n_layer);
                match ft {
                    F::Q2_K => T::Q3_K,
                    F::Q3_K_M if i < n / 16 => T::Q5_K,
                    F::Q3_K_M => T::Q4_K,
                    F::Q3_K_L => T::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::Q4_K_S if i < n / 8 => T::Q5_K,
                    _ => default,
                }
            }
            Category::Other => default,
        }
    }
}

/// llama-quantize's substitutes when a row is not a whole number of blocks of the chosen type.
fn fallback(ty: GgmlType, row: u64) -> GgmlType {
    if row.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let alt = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    };
    if row.is_multiple_of(alt.block_size() as u64) {
        alt
    } else {
        GgmlType::F16
    }
}

/// llama-quantize writes tensors ordered by layer number (non-layer tensors first), then by name.
pub fn sort_like_llama_quantize(names: &mut [String]) {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|d| d.parse().ok())
            .unwrap_or(-1)
    };
    names.sort_by(|a, b| layer(a).cmp(&layer(b)).then_with(|| a.cmp(b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_32_layers() {
        let picked: Vec<i64> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(
            picked,
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn never_quantized() {
        assert!(!is_quantizable("blk.0.ssm_conv1d.weight", &[4, 512]));
        assert!(!is_quantizable("blk.0.attn_norm.weight", &[256]));
        assert!(!is_quantizable("blk.0.ssm_a", &[4]));
        assert!(!is_quantizable("blk.0.ssm_dt.bias", &[4]));
        assert!(!is_quantizable("blk.0.attn_q_norm.weight", &[64]));
        assert!(
            !is_quantizable("x.weight", &[4096, 1]),
            "[n, 1] counts as 1-D"
        );
        assert!(is_quantizable("blk.0.ssm_alpha.weight", &[256, 4]));
    }

    #[test]
    fn fallbacks() {
        assert_eq!(fallback(GgmlType::Q4_K, 128), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q6_K, 96), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q2_K, 100), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q4_K, 256), GgmlType::Q4_K);
    }

    #[test]
    fn sorting() {
        let mut v: Vec<String> = [
            "blk.10.a",
            "blk.2.b",
            "token_embd.weight",
            "blk.2.a",
            "output.weight",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        sort_like_llama_quantize(&mut v);
        assert_eq!(
            v,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }
}
