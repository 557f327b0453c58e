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
    Q2_K_S,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ1_S,
    IQ1_M,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XXS,
    IQ3_XS,
    IQ3_S,
    IQ3_M,
    IQ4_NL,
    IQ4_XS,
    TQ1_0,
    TQ2_0,
}

impl FileType {
    pub const ALL: [FileType; 32] = [
        FileType::F32,
        FileType::F16,
        FileType::BF16,
        FileType::Q4_0,
        FileType::Q4_1,
        FileType::Q5_0,
        FileType::Q5_1,
        FileType::Q8_0,
        FileType::Q2_K,
        FileType::Q2_K_S,
        FileType::Q3_K_S,
        FileType::Q3_K_M,
        FileType::Q3_K_L,
        FileType::Q4_K_S,
        FileType::Q4_K_M,
        FileType::Q5_K_S,
        FileType::Q5_K_M,
        FileType::Q6_K,
        FileType::IQ1_S,
        FileType::IQ1_M,
        FileType::IQ2_XXS,
        FileType::IQ2_XS,
        FileType::IQ2_S,
        FileType::IQ2_M,
        FileType::IQ3_XXS,
        FileType::IQ3_XS,
        FileType::IQ3_S,
        FileType::IQ3_M,
        FileType::IQ4_NL,
        FileType::IQ4_XS,
        FileType::TQ1_0,
        FileType::TQ2_0,
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
            FileType::IQ2_XXS => 19,
            FileType::IQ2_XS => 20,
            FileType::Q2_K_S => 21,
            FileType::IQ3_XS => 22,
            FileType::IQ3_XXS => 23,
            FileType::IQ1_S => 24,
            FileType::IQ4_NL => 25,
            FileType::IQ3_S => 26,
            FileType::IQ3_M => 27,
            FileType::IQ2_S => 28,
            FileType::IQ2_M => 29,
            FileType::IQ4_XS => 30,
            FileType::IQ1_M => 31,
            FileType::BF16 => 32,
            FileType::TQ1_0 => 36,
            FileType::TQ2_0 => 37,
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
            FileType::Q2_K_S => "Q2_K_S",
            FileType::Q3_K_S => "Q3_K_S",
            FileType::Q3_K_M => "Q3_K_M",
            FileType::Q3_K_L => "Q3_K_L",
            FileType::Q4_K_S => "Q4_K_S",
            FileType::Q4_K_M => "Q4_K_M",
            FileType::Q5_K_S => "Q5_K_S",
            FileType::Q5_K_M => "Q5_K_M",
            FileType::Q6_K => "Q6_K",
            FileType::IQ1_S => "IQ1_S",
            FileType::IQ1_M => "IQ1_M",
            FileType::IQ2_XXS => "IQ2_XXS",
            FileType::IQ2_XS => "IQ2_XS",
            FileType::IQ2_S => "IQ2_S",
            FileType::IQ2_M => "IQ2_M",
            FileType::IQ3_XXS => "IQ3_XXS",
            FileType::IQ3_XS => "IQ3_XS",
            FileType::IQ3_S => "IQ3_S",
            FileType::IQ3_M => "IQ3_M",
            FileType::IQ4_NL => "IQ4_NL",
            FileType::IQ4_XS => "IQ4_XS",
            FileType::TQ1_0 => "TQ1_0",
            FileType::TQ2_0 => "TQ2_0",
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

    /// Whether llama-quantize refuses to make this file type without an importance matrix: its
    /// default type needs one ([`tensor_requires_imatrix`]), or some of its tensors get IQ3_XXS
    /// (IQ3_XS).
    pub fn needs_imatrix(self) -> bool {
        self == FileType::IQ3_XS
            || tensor_requires_imatrix("blk.0.ffn_up.weight", self.default_type(), self)
    }

    /// The type of every quantizable tensor that no rule singles out (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        use GgmlType as T;
        match self {
            FileType::F32 => T::F32,
            FileType::F16 => T::F16,
            FileType::BF16 => T::BF16,
            FileType::Q4_0 => T::Q4_0,
            FileType::Q4_1 => T::Q4_1,
            FileType::Q5_0 => T::Q5_0,
            FileType::Q5_1 => T::Q5_1,
            FileType::Q8_0 => T::Q8_0,
            FileType::Q2_K | FileType::Q2_K_S => T::Q2_K,
            FileType::Q3_K_S | FileType::Q3_K_M | FileType::Q3_K_L => T::Q3_K,
            FileType::Q4_K_S | FileType::Q4_K_M => T::Q4_K,
            FileType::Q5_K_S | FileType::Q5_K_M => T::Q5_K,
            FileType::Q6_K => T::Q6_K,
            FileType::IQ1_S => T::IQ1_S,
            FileType::IQ1_M => T::IQ1_M,
            FileType::IQ2_XXS => T::IQ2_XXS,
            // IQ2_S files are mostly IQ2_XS; IQ2_M files mostly IQ2_S.
            FileType::IQ2_XS | FileType::IQ2_S => T::IQ2_XS,
            FileType::IQ2_M => T::IQ2_S,
            FileType::IQ3_XXS => T::IQ3_XXS,
            FileType::IQ3_XS | FileType::IQ3_S | FileType::IQ3_M => T::IQ3_S,
            FileType::IQ4_NL => T::IQ4_NL,
            FileType::IQ4_XS => T::IQ4_XS,
            FileType::TQ1_0 => T::TQ1_0,
            FileType::TQ2_0 => T::TQ2_0,
        }
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

/// llama.cpp's `tensor_get_category`: exact names for the two embeddings, substrings (in this order) for the rest.
fn category(name: &str) -> Category {
    use Category as C;
    if name == "output.weight" {
        return C::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return C::TokenEmbd;
    }
    const BY_SUBSTRING: [(&str, Category); 9] = [
        ("attn_qkv.weight", C::AttnQkv),
        ("attn_kv_b.weight", C::AttnKvB),
        ("attn_v.weight", C::AttnV),
        ("attn_k.weight", C::AttnK),
        ("attn_q.weight", C::AttnQ),
        ("attn_output.weight", C::AttnOutput),
        ("ffn_up", C::FfnUp),
        ("ffn_gate", C::FfnGate),
        ("ffn_down", C::FfnDown),
    ];
    BY_SUBSTRING
        .iter()
        .find(|(s, _)| name.contains(s))
        .map_or(C::Other, |&(_, c)| c)
}

/// The attn_v-like tensors share one counter and one rule.
fn is_attn_v_like(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third in between.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// llama.cpp's `tensor_requires_imatrix`: the tensors llama-quantize refuses to make without importance
/// weights (never the embeddings or the output).
pub fn tensor_requires_imatrix(name: &str, ty: GgmlType, ftype: FileType) -> bool {
    use GgmlType as T;
    if matches!(category(name), Category::TokenEmbd | Category::Output) {
        return false;
    }
    match ty {
        T::IQ3_XXS | T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ1_M | T::IQ1_S => true,
        T::Q2_K => ftype == FileType::Q2_K_S,
        _ => false,
    }
}

/// Per-file state of the recipe: the running counters llama-quantize keeps while it walks the tensors
/// in its order (by layer number, then name; see [`sort_like_llama_quantize`]).
pub struct Recipe {
    pub ftype: FileType,
    pub pure: bool,
    /// Whether an importance matrix is used (some IQ and legacy rules depend on it).
    pub has_imatrix: bool,
    /// `--token-embedding-type` / `--output-tensor-type`.
    pub token_embedding_type: Option<GgmlType>,
    pub output_tensor_type: Option<GgmlType>,
    /// `--tensor-type PATTERN=TYPE`, in the order given.
    pub tensor_types: Vec<TensorTypeOverride>,
    n_layer: i64,
    n_gqa: u64,
    n_expert: u64,
    is_falcon: bool,
    has_output: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
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
            let c = category(n);
            has_output |= c == Category::Output;
            n_attention_wv += is_attn_v_like(c) as i64;
        }
        Recipe {
            ftype,
            pure,
            has_imatrix: false,
            token_embedding_type: None,
            output_tensor_type: None,
            tensor_types: Vec::new(),
            n_layer: n_layer as i64,
            n_gqa,
            n_expert: 0,
            is_falcon: false,
            has_output,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        }
    }

    /// The architecture (`general.architecture`) and `<arch>.expert_count`, which some rules depend on.
    pub fn with_model(mut self, arch: &str, n_expert: u64) -> Recipe {
        self.is_falcon = arch == "falcon";
        self.n_expert = n_expert;
        self
    }

    /// The type for the next tensor, or `None` if it is copied unchanged. Call in llama-quantize's order.
    /// An error for a MoE tensor whose layer cannot be read from its name (as llama-quantize).
    pub fn choose(&mut self, name: &str, ne: &[u64]) -> anyhow::Result<Option<GgmlType>> {
        if !is_quantizable(name, ne) {
            return Ok(None);
        }
        let cat = category(name);
        if let (Some(t), Category::TokenEmbd) = (self.token_embedding_type, cat) {
            return Ok(Some(t));
        }
        if let (Some(t), Category::Output) = (self.output_tensor_type, cat) {
            return Ok(Some(t));
        }
        let default = self.ftype.default_type();
        if !default.is_quantized() {
            return Ok(Some(default));
        }
        // The first --tensor-type pattern found in the name wins, even with --pure; the mixture (and
        // so its per-layer counters) is then skipped for this tensor, as in llama-quantize.
        let manual = self
            .tensor_types
            .iter()
            .find(|o| o.matches(name))
            .map(|o| o.ty);
        let ty = match manual {
            Some(ty) => ty,
            None if self.pure => default,
            None => self.mixture(name, ne, default, cat)?,
        };
        Ok(Some(fallback(ty, ne[0])))
    }

    /// The layer a per-layer rule uses: the running counter, or for MoE models the `blk.N.` of the name.
    fn layer(&self, counter: i64, name: &str) -> anyhow::Result<(i64, i64)> {
        let n = self.n_layer;
        if self.n_expert <= 1 {
            return Ok((counter, n));
        }
        let i: i64 = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("failed to determine the layer of tensor {name}"))?;
        anyhow::ensure!(
            (0..n).contains(&i),
            "bad layer {i} for tensor {name}: must be in [0, {n})"
        );
        Ok((i, n))
    }

    /// llama.cpp's `llama_tensor_get_type_impl` (without the "70B" size class and the glm5-next and
    /// MXFP4_MOE rules).
    fn mixture(
        &mut self,
        name: &str,
        ne: &[u64],
        default: GgmlType,
        cat: Category,
    ) -> anyhow::Result<GgmlType> {
        use FileType as F;
        use GgmlType as T;
        let ft = self.ftype;
        let is_iq1_iq2 = matches!(
            ft,
            F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M
        );
        let iq2_s_or_m = matches!(ft, F::IQ2_S | F::IQ2_M);
        let gqa4 = self.n_gqa >= 4;
        let mut ty = default;

        if cat == Category::Output || (!self.has_output && cat == Category::TokenEmbd) {
            // Tied embeddings double as the LM head.
            ty = if let Some(t) = self.output_tensor_type {
                t
            } else if self.is_falcon || !ne[0].is_multiple_of(default.block_size() as u64) {
                T::Q8_0
            } else if is_iq1_iq2 || ft == F::IQ3_XXS {
                T::Q5_K
            } else if default != T::Q8_0 {
                T::Q6_K
            } else {
                default
            };
        } else if cat == Category::TokenEmbd {
            ty = match ft {
                F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M => T::Q2_K,
                F::IQ2_S | F::IQ2_M | F::IQ3_XXS => T::IQ3_S,
                F::TQ1_0 | F::TQ2_0 => T::Q4_K,
                _ => default,
            };
        } else if is_iq1_iq2 {
            if is_attn_v_like(cat) {
                ty = if gqa4 || self.n_expert >= 4 {
                    T::Q4_K
                } else if iq2_s_or_m {
                    T::IQ3_S
                } else {
                    T::Q2_K
                };
                self.i_attention_wv += 1;
            } else if self.n_expert == 8 && cat == Category::AttnK {
                ty = T::Q4_K;
            } else if cat == Category::FfnDown {
                if self.i_ffn_down < self.n_layer / 8 {
                    ty = if iq2_s_or_m { T::IQ3_S } else { T::Q2_K };
                }
                self.i_ffn_down += 1;
            } else if cat == Category::AttnOutput {
                if self.n_expert == 8 {
                    ty = T::Q5_K;
                } else if matches!(ft, F::IQ1_S | F::IQ1_M) {
                    ty = T::IQ2_XXS;
                } else if iq2_s_or_m {
                    ty = T::IQ3_S;
                }
            }
        } else if is_attn_v_like(cat) {
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            ty = match ft {
                F::Q2_K if gqa4 => T::Q4_K,
                F::Q2_K => T::Q3_K,
                F::Q2_K_S if gqa4 => T::Q4_K,
                F::IQ3_XXS if gqa4 => T::Q4_K,
                F::IQ3_XXS if !self.has_imatrix => T::IQ3_S,
                F::IQ3_XXS => T::IQ3_XXS,
                F::IQ3_XS | F::IQ3_S if gqa4 => T::Q4_K,
                F::IQ3_M => T::Q4_K,
                F::Q3_K_M if i < 2 => T::Q5_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::IQ4_NL | F::IQ4_XS if gqa4 => T::Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                F::Q4_K_S if i < 4 => T::Q5_K,
                _ => default,
            };
            if self.n_expert == 8 {
                ty = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if self.n_expert == 8 {
                ty = T::Q8_0;
            } else if ft == F::IQ3_XS {
                ty = T::IQ3_XXS;
            } else if ft == F::IQ3_XXS {
                ty = T::IQ2_S;
            }
        } else if cat == Category::AttnQ {
            if ft == F::IQ3_XS {
                ty = T::IQ3_XXS;
            } else if ft == F::IQ3_XXS {
                ty = T::IQ2_S;
            }
        } else if cat == Category::FfnDown {
            let (i, n) = self.layer(self.i_ffn_down, name)?;
            let falcon = self.is_falcon;
            ty = match ft {
                F::Q2_K => T::Q3_K,
                F::Q2_K_S if i < n / 8 => T::Q4_K,
                F::Q2_K_S => default,
                F::IQ3_XXS if !self.has_imatrix && i < n / 8 => T::Q4_K,
                F::IQ3_XXS if !self.has_imatrix => T::Q3_K,
                F::Q3_K_M if i < n / 16 => T::Q5_K,
                F::Q3_K_M if !falcon || use_more_bits(i, n) => T::Q4_K,
                F::Q3_K_M => T::Q3_K,
                F::IQ3_M if i < n / 8 || (self.n_expert == 8 && use_more_bits(i, n)) => T::Q4_K,
                F::Q3_K_L if falcon => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::Q4_K_M if falcon && i < n / 16 => T::Q6_K,
                F::Q4_K_M if falcon && use_more_bits(i, n) => T::Q5_K,
                F::Q4_K_M if falcon => T::Q4_K,
                F::Q4_K_M if use_more_bits(i, n) => T::Q6_K,
                F::Q4_K_M => default,
                F::IQ4_NL | F::IQ4_XS if i < n / 8 && !self.has_imatrix => T::Q5_K,
                F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                F::Q4_K_S if !falcon && i < n / 8 => T::Q5_K,
                // Only with an imatrix, so files made without one stay as they always were.
                F::Q4_0 if self.has_imatrix && i < n / 8 => T::Q4_1,
                F::Q5_0 if self.has_imatrix && i < n / 8 => T::Q5_1,
                _ => default,
            };
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !self.is_falcon {
                if self.n_expert == 8 {
                    if matches!(
                        ft,
                        F::Q2_K
                            | F::IQ3_XS
                            | F::IQ3_XXS
                            | F::Q3_K_S
                            | F::Q3_K_M
                            | F::IQ4_NL
                            | F::Q4_K_S
                            | F::Q4_K_M
                            | F::IQ3_S
                            | F::IQ3_M
                            | F::IQ4_XS
                    ) {
                        ty = T::Q5_K;
                    }
                } else {
                    ty = match ft {
                        F::Q2_K => T::Q3_K,
                        F::IQ3_XXS => T::IQ3_S,
                        F::Q3_K_M | F::IQ3_M => T::Q4_K,
                        F::Q3_K_L => T::Q5_K,
                        _ => default,
                    };
                }
            } else if ft == F::Q3_K_L {
                ty = T::Q4_K;
            }
        } else if cat == Category::FfnGate || cat == Category::FfnUp {
            // (llama.cpp's separate attn_qkv rule is unreachable: attn_qkv is attn_v-like.)
            let counter = if cat == Category::FfnGate {
                &mut self.i_ffn_gate
            } else {
                &mut self.i_ffn_up
            };
            let c = *counter;
            *counter += 1;
            let (i, n) = self.layer(c, name)?;
            if ft == F::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
                ty = T::IQ3_XXS;
            }
        }
        Ok(ty)
    }
}

/// A type a tensor can be quantized to, by its ggml name (any case): a block format, F32, F16 or BF16
/// (llama-quantize's types for `--tensor-type`, `--token-embedding-type`, `--output-tensor-type`).
pub fn tensor_type_from_name(name: &str) -> Option<GgmlType> {
    GgmlType::from_name(name).filter(|t| {
        t.block_size() > 1 || matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    })
}

/// llama-quantize's `--tensor-type PATTERN=TYPE`: tensors whose name contains a match of the regular
/// expression PATTERN (lower-cased, as llama-quantize does) get TYPE instead of the mixture's choice
/// (after `--token-embedding-type` / `--output-tensor-type`, before the block-size fallback).
#[derive(Clone, Debug)]
pub struct TensorTypeOverride {
    pub pattern: String,
    regex: fancy_regex::Regex,
    pub ty: GgmlType,
}

impl TensorTypeOverride {
    /// Parses `PATTERN=TYPE` (TYPE a ggml type name, any case).
    pub fn parse(arg: &str) -> anyhow::Result<TensorTypeOverride> {
        let (name, ty) = arg.split_once('=').ok_or_else(|| {
            anyhow::anyhow!("malformed tensor type '{arg}': expected PATTERN=TYPE")
        })?;
        anyhow::ensure!(!name.is_empty(), "missing tensor name in '{arg}'");
        anyhow::ensure!(!ty.is_empty(), "missing quantization type in '{arg}'");
        let ty = tensor_type_from_name(ty)
            .ok_or_else(|| anyhow::anyhow!("invalid quantization type '{ty}' in '{arg}'"))?;
        let pattern = name.to_lowercase();
        let regex = fancy_regex::Regex::new(&pattern)
            .map_err(|e| anyhow::anyhow!("bad tensor name pattern '{pattern}': {e}"))?;
        Ok(TensorTypeOverride { pattern, regex, ty })
    }

    /// llama-quantize's `--tensor-type-file`: entries separated by white space.
    pub fn parse_file(path: &std::path::Path) -> anyhow::Result<Vec<TensorTypeOverride>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read tensor type file {}: {e}", path.display()))?;
        text.split_whitespace()
            .map(|a| {
                TensorTypeOverride::parse(a).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
            })
            .collect()
    }

    /// Whether the pattern occurs in `name` (a regex search). A pattern too costly to decide (fancy-regex's
    /// backtracking limit) counts as no match.
    pub fn matches(&self, name: &str) -> bool {
        self.regex.is_match(name).unwrap_or(false)
    }
}

/// llama-quantize's substitutes when a row is not a whole number of blocks of the chosen type.
fn fallback(ty: GgmlType, row: u64) -> GgmlType {
    use GgmlType as T;
    if row.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let alt = match ty {
        T::IQ1_S
        | T::IQ1_M
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ4_XS => T::IQ4_NL,
        T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        other => other,
    };
    if row.is_multiple_of(alt.block_size() as u64) {
        alt
    } else {
        T::F16
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
    fn tensor_type_overrides_parse_as_llama_quantize() {
        let o = TensorTypeOverride::parse(r"BLK\.24\.=Q4_k").unwrap();
        assert_eq!((o.pattern.as_str(), o.ty), (r"blk\.24\.", GgmlType::Q4_K));
        assert!(o.matches("blk.24.ffn_up.weight") && !o.matches("blk.2.ffn_up.weight"));
        for bad in [
            "attn_q",
            "=q4_0",
            "attn_q=",
            "attn_q=q9_9",
            "attn_q=i8",
            "(=q4_0",
        ] {
            let e = TensorTypeOverride::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad.split('=').next().unwrap()), "{bad}: {e}");
        }
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
