//! The byte-level BPE tokenizer of Qwen3.5 GGUF files, built in memory from the GGUF metadata
//! (`tokenizer.ggml.*`), with llama.cpp's semantics.
//!
//! Encoding: the text is first split on special-token strings (llama.cpp's `tokenizer_st_partition`:
//! USER_DEFINED tokens always, CONTROL tokens only with `parse_special`), then every plain fragment is
//! split into words by the pre-tokenizer regex (the Hugging Face `tokenizers` crate's `Split(qwen35
//! regex, Isolated)`), and each word's bytes are merged by our own BPE over token ids ([`bpe`]: the
//! GPT-2 byte-to-char map folded into a byte -> token table, the GGUF merges in one compact table).
//! No normalization (llama.cpp applies none; the HF `tokenizer.json` declares NFC, which changes
//! non-NFC input only).
//!
//! Decoding follows llama.cpp's `token_to_piece`: NORMAL tokens are mapped back through the byte map,
//! USER_DEFINED tokens are copied as they are, CONTROL / UNKNOWN tokens appear only when `special` is
//! asked for, and UNUSED / BYTE / undefined ones never.
//!
//! Memory: the 248k-token vocabulary's strings in one contiguous table (pieces are decoded from them
//! when asked for), a sorted index for lookups by text, and the 500k merges in compressed rows: about
//! 13 MB in all, where the `tokenizers`
//! crate's BPE model held about 90 MB (its vocabulary twice as maps of heap strings, and the merges).
//! [`Tokenizer`] is `Send + Sync`, so a caller can build it on a thread while it loads the weights.

mod bpe;

use std::borrow::Cow;
use std::collections::HashMap;

use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

use bpe::{Bpe, BpeScratch};

use crate::gguf::{GgufError, GgufFile, Value};

/// The pre-tokenizer regex of `tokenizer.ggml.pre = "qwen35"` (Qwen3.5's `tokenizer.json`).
pub const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regex of `tokenizer.ggml.pre = "qwen2"` (Qwen2 / Qwen3).
pub const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("invalid tokenizer: {0}")]
    Invalid(String),
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Encode(String),
}

/// llama.cpp's `llama_token_type` (the values of `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    pub fn from_gguf(v: i128) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    pub fn to_gguf(self) -> i32 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => 1,
            TokenType::Unknown => 2,
            TokenType::Control => 3,
            TokenType::UserDefined => 4,
            TokenType::Unused => 5,
            TokenType::Byte => 6,
        }
    }
}

/// A special (non-NORMAL) token that the text splitter looks for.
#[derive(Clone, Debug)]
struct SpecialToken {
    text: String,
    id: u32,
    ty: TokenType,
}

/// A contiguous store of byte strings, one per token (avoids a quarter million small allocations).
#[derive(Clone, Debug, Default)]
struct ByteTable {
    data: Vec<u8>,
    /// `ends[i]` is the end of entry `i` in `data`; entry `i` starts at `ends[i - 1]` (or 0).
    ends: Vec<u32>,
}

impl ByteTable {
    fn with_capacity(n: usize, bytes: usize) -> ByteTable {
        ByteTable {
            data: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
        self.ends.push(self.data.len() as u32);
    }

    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.data[start..self.ends[i] as usize]
    }
}

/// GPT-2's `bytes_to_unicode`: byte -> the char that stands for it in byte-level BPE vocabularies.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            let c = char::from_u32(256 + n).expect("below the surrogates");
            n += 1;
            c
        };
    }
    table
}

/// Inverse of [`byte_to_char_table`], indexed by code point (all are below 0x144).
fn char_to_byte_table() -> [i16; 0x144] {
    let mut inv = [-1i16; 0x144];
    for (b, c) in byte_to_char_table().iter().enumerate() {
        inv[*c as usize] = b as i16;
    }
    inv
}

/// Maps a byte-level vocabulary string back to bytes; chars outside the map are kept as UTF-8
/// (llama.cpp's `llama_decode_text` does the same).
fn byte_level_decode(text: &str, inv: &[i16; 0x144], out: &mut Vec<u8>) {
    for c in text.chars() {
        match inv.get(c as usize) {
            Some(&b) if b >= 0 => out.push(b as u8),
            _ => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// The per-token tables, built in one pass over the token strings.
struct Tables {
    texts: ByteTable,
    types: Vec<TokenType>,
    specials: Vec<SpecialToken>,
}

impl Tables {
    fn build<'a>(
        texts_iter: impl Iterator<Item = Result<&'a str, TokenizerError>>,
        n: usize,
        types: Vec<TokenType>,
    ) -> Result<Tables, TokenizerError> {
        if types.len() != n {
            return Err(TokenizerError::Invalid(format!(
                "{} token types for {n} tokens",
                types.len()
            )));
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::Invalid("too many tokens".into()));
        }
        let mut texts = ByteTable::with_capacity(n, n * 8);
        let mut specials = Vec::new();
        for (id, text) in texts_iter.enumerate() {
            let text = text?;
            let ty = *types
                .get(id)
                .ok_or_else(|| TokenizerError::Invalid(format!("more than {n} tokens")))?;
            texts.push(text.as_bytes());
            if matches!(
                ty,
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown
            ) && !text.is_empty()
            {
                specials.push(SpecialToken {
                    text: text.to_string(),
                    id: id as u32,
                    ty,
                });
            }
        }
        if texts.ends.len() != n {
            return Err(TokenizerError::Invalid(format!(
                "{} token strings for {n} tokens",
                texts.ends.len()
            )));
        }
        Ok(Tables {
            texts,
            types,
            specials,
        })
    }
}

/// Pieces of text after splitting on special tokens.
#[derive(Debug, PartialEq, Eq)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Clone)]
pub struct Tokenizer {
    /// The pre-tokenizer: the regex that cuts plain text into words.
    split: Split,
    /// The merges that turn a word's bytes into tokens.
    bpe: Bpe,
    /// The GGUF token strings, as stored.
    texts: ByteTable,
    /// Token ids ordered by their string (then id), for lookups by text.
    by_text: Vec<u32>,
    /// The byte each char of NORMAL tokens' strings stands for (-1: kept as UTF-8). Pieces are
    /// decoded when asked for rather than stored: a second table would cost 2.7 MB of resident memory.
    char_to_byte: [i16; 0x144],
    types: Vec<TokenType>,
    /// CONTROL / USER_DEFINED / UNKNOWN tokens, longest text first.
    specials: Vec<SpecialToken>,
    special_ids: HashMap<String, u32>,
    pre: String,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.n_vocab())
            .field("pre", &self.pre)
            .field("n_special", &self.specials.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish()
    }
}

fn opt_u32(f: &GgufFile, key: &str) -> Result<Option<u32>, TokenizerError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => match v.as_int() {
            Some(i) if (0..=u32::MAX as i128).contains(&i) => Ok(Some(i as u32)),
            // llama.cpp writes -1 (as u32: 0xFFFFFFFF is kept) for "none" in some converters.
            Some(_) => Ok(None),
            None => Err(TokenizerError::Invalid(format!("{key} is not an integer"))),
        },
    }
}

fn opt_bool(f: &GgufFile, key: &str) -> Option<bool> {
    f.get(key).and_then(|v: Value<'_>| v.as_bool())
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let model = f.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::Unsupported(format!(
                "tokenizer.ggml.model = {model:?} (only byte-level BPE, \"gpt2\", is supported)"
            )));
        }
        let pre = f.get_str("tokenizer.ggml.pre").unwrap_or("default");
        let tokens = f.get_array("tokenizer.ggml.tokens")?;
        let n = tokens.len;
        let types: Vec<TokenType> = match f.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n],
            Some(v) => {
                let ints = v.as_array().and_then(|a| a.ints()).ok_or_else(|| {
                    TokenizerError::Invalid(
                        "tokenizer.ggml.token_type is not an integer array".into(),
                    )
                })?;
                if ints.len() != n {
                    return Err(TokenizerError::Invalid(format!(
                        "{} token types for {n} tokens",
                        ints.len()
                    )));
                }
                ints.into_iter().map(TokenType::from_gguf).collect()
            }
        };
        let strings = tokens.strings().ok_or_else(|| {
            TokenizerError::Invalid("tokenizer.ggml.tokens is not a string array".into())
        })?;
        let merges_view = f.get_array("tokenizer.ggml.merges")?;
        let merge_strings = merges_view.strings().ok_or_else(|| {
            TokenizerError::Invalid("tokenizer.ggml.merges is not a string array".into())
        })?;
        let ids = TokenizerIds {
            bos: opt_u32(f, "tokenizer.ggml.bos_token_id")?,
            eos: opt_u32(f, "tokenizer.ggml.eos_token_id")?,
            pad: opt_u32(f, "tokenizer.ggml.padding_token_id")?,
            add_bos: opt_bool(f, "tokenizer.ggml.add_bos_token").unwrap_or(false),
            add_eos: opt_bool(f, "tokenizer.ggml.add_eos_token").unwrap_or(false),
        };
        let texts = strings.map(|s| {
            std::str::from_utf8(s)
                .map_err(|_| TokenizerError::Invalid("a token is not valid UTF-8".into()))
        });
        let tables = Tables::build(texts, n, types)?;
        let merges = merge_strings.enumerate().map(|(rank, m)| {
            parse_merge(m).ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "merge {rank} {:?} is malformed",
                    String::from_utf8_lossy(m)
                ))
            })
        });
        Self::finish(tables, merges, merges_view.len, pre, ids)
    }

    /// Builds the tokenizer from its parts: token strings (byte-level encoded, as in GGUF), token
    /// types, merges (pairs of token strings, highest priority first) and the `pre` name.
    pub fn from_parts(
        tokens: &[&str],
        types: Vec<TokenType>,
        merges: &[(&str, &str)],
        pre: &str,
        ids: TokenizerIds,
    ) -> Result<Tokenizer, TokenizerError> {
        let tables = Tables::build(tokens.iter().map(|s| Ok(*s)), tokens.len(), types)?;
        let pairs = merges.iter().map(|(a, b)| Ok((a.as_bytes(), b.as_bytes())));
        Self::finish(tables, pairs, merges.len(), pre, ids)
    }

    /// `merges`: the merges' two parts, best first.
    fn finish<'m>(
        tables: Tables,
        merges: impl Iterator<Item = Result<(&'m [u8], &'m [u8]), TokenizerError>>,
        n_merges: usize,
        pre: &str,
        ids: TokenizerIds,
    ) -> Result<Tokenizer, TokenizerError> {
        let Tables {
            texts,
            types,
            mut specials,
        } = tables;
        let n = types.len();
        let regex = match pre {
            "qwen35" => QWEN35_REGEX,
            "qwen2" => QWEN2_REGEX,
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer.ggml.pre = {other:?} (supported: qwen35, qwen2)"
                )))
            }
        };
        for (name, id) in [("bos", ids.bos), ("eos", ids.eos), ("padding", ids.pad)] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(TokenizerError::Invalid(format!(
                        "{name} token id {id} >= {n} tokens"
                    )));
                }
            }
        }
        // The merge table (through a transient text -> id map) and, on a second thread, the sorted
        // index for `token_to_id`.
        let (bpe, by_text) = std::thread::scope(|scope| {
            let by_text = scope.spawn(|| sorted_by_text(&texts));
            let bpe = build_bpe(&texts, merges, n_merges);
            (bpe, by_text.join().expect("index thread panicked"))
        });
        let bpe = bpe?;
        // Longest first (llama.cpp sorts by length, descending); ties by id for determinism.
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let special_ids = specials.iter().map(|s| (s.text.clone(), s.id)).collect();

        let split = Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Invalid(format!("pre-tokenizer regex: {e}")))?;

        // End of generation: eos, plus the tokens llama.cpp adds to its EOG set by name.
        let mut eog: Vec<u32> = ids.eos.into_iter().collect();
        for s in &specials {
            if matches!(
                s.text.as_str(),
                "<|im_end|>" | "<|endoftext|>" | "<|eot_id|>" | "<|end|>" | "<end_of_turn>"
            ) && !eog.contains(&s.id)
            {
                eog.push(s.id);
            }
        }
        eog.sort_unstable();

        Ok(Tokenizer {
            split,
            bpe,
            texts,
            by_text,
            char_to_byte: char_to_byte_table(),
            types,
            specials,
            special_ids,
            pre: pre.to_string(),
            bos: ids.bos,
            eos: ids.eos,
            pad: ids.pad,
            add_bos: ids.add_bos,
            add_eos: ids.add_eos,
            eog,
        })
    }

    /// Number of token ids (the LM head width).
    pub fn n_vocab(&self) -> usize {
        self.types.len()
    }

    pub fn pre(&self) -> &str {
        &self.pre
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// `tokenizer.ggml.add_bos_token` (false for Qwen3.5).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// End-of-generation ids: eos and `<|im_end|>` / `<|endoftext|>` (sorted).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The token's string as stored in the GGUF (byte-level encoded for NORMAL tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        if (id as usize) < self.types.len() {
            std::str::from_utf8(self.texts.get(id as usize)).ok()
        } else {
            None
        }
    }

    /// The id of a token by its GGUF string (byte-level encoded for NORMAL tokens, e.g. `"Ġworld"`).
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        let text = text.as_bytes();
        let i = self
            .by_text
            .partition_point(|&id| self.texts.get(id as usize) < text);
        let id = *self.by_text.get(i)?;
        (self.texts.get(id as usize) == text).then_some(id)
    }

    /// The id of a special (CONTROL / USER_DEFINED / UNKNOWN) token by its text, e.g. `"</think>"`.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        self.special_ids.get(text).copied()
    }

    /// Tokenizes `text`. `parse_special`: CONTROL tokens written in the text become those tokens
    /// (use for rendered chat templates); otherwise their text is tokenized like any other
    /// (use for untrusted text). USER_DEFINED tokens are always matched, as in llama.cpp.
    /// `add_special`: prepend BOS / append EOS if the GGUF asks for it (`add_bos_token`).
    pub fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        let mut scratch = BpeScratch::default();
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => self.encode_plain(t, &mut scratch, &mut out)?,
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Text without special tokens: cut into words by the regex, each word's bytes merged by BPE.
    fn encode_plain(
        &self,
        text: &str,
        scratch: &mut BpeScratch,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let mut words = PreTokenizedString::from(text);
        self.split
            .pre_tokenize(&mut words)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        for (word, _, _) in words.get_splits(OffsetReferential::Original, OffsetType::None) {
            self.bpe.encode_word(word.as_bytes(), scratch, out);
        }
        Ok(())
    }

    /// Tokenizes `text` without BOS/EOS (see [`Tokenizer::encode_with`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, false, parse_special)
    }

    /// llama.cpp's `tokenizer_st_partition`: for each special token, longest first, split every
    /// remaining text fragment at each of its occurrences.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        if text.is_empty() {
            return Vec::new();
        }
        for sp in &self.specials {
            if sp.ty == TokenType::Control && !parse_special {
                continue;
            }
            if sp.ty == TokenType::Unknown && !parse_special {
                continue;
            }
            if !text.contains(sp.text.as_str()) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(t) => {
                        let mut rest = t;
                        while let Some(pos) = rest.find(sp.text.as_str()) {
                            if pos > 0 {
                                next.push(Fragment::Text(&rest[..pos]));
                            }
                            next.push(Fragment::Token(sp.id));
                            rest = &rest[pos + sp.text.len()..];
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    tok => next.push(tok),
                }
            }
            frags = next;
        }
        frags
    }

    /// What `id` decodes to, as bytes (may be part of a UTF-8 sequence). `special`: render CONTROL
    /// and UNKNOWN tokens as their text (llama.cpp's `special` flag); otherwise they are empty.
    /// Ids out of range decode to nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Cow<'_, [u8]> {
        let text = || self.texts.get(id as usize);
        match self.types.get(id as usize) {
            Some(TokenType::Normal) => {
                let text = text();
                // '!'..='~' stand for themselves in the byte map.
                if text.iter().all(|b| (b'!'..=b'~').contains(b)) {
                    return Cow::Borrowed(text);
                }
                let mut out = Vec::with_capacity(text.len());
                match std::str::from_utf8(text) {
                    Ok(text) => byte_level_decode(text, &self.char_to_byte, &mut out),
                    // Unreachable: the table is filled from `&str`s.
                    Err(_) => out.extend_from_slice(text),
                }
                Cow::Owned(out)
            }
            Some(TokenType::UserDefined) => Cow::Borrowed(text()),
            Some(TokenType::Control) | Some(TokenType::Unknown) if special => Cow::Borrowed(text()),
            _ => Cow::Borrowed(&[]),
        }
    }

    /// The bytes of a token sequence (see [`Tokenizer::token_to_piece`]).
    pub fn decode_bytes(&self, ids: &[u32], special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(&self.token_to_piece(id, special));
        }
        out
    }

    /// Decodes to a string; invalid UTF-8 (e.g. a sequence cut in the middle of a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, special)).into_owned()
    }

    /// A streaming detokenizer (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, special: bool) -> StreamDecoder {
        StreamDecoder::new(special)
    }
}

/// The special token ids and flags of a tokenizer.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenizerIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}

/// Splits a GGUF merge `"a b"` at the first space after the first byte (llama.cpp's rule).
fn parse_merge(m: &[u8]) -> Option<(&[u8], &[u8])> {
    let pos = m.iter().skip(1).position(|&b| b == b' ')? + 1;
    Some((&m[..pos], &m[pos + 1..]))
}

/// Token ids ordered by their string, ties by id (so the first of equal strings is the lowest id).
fn sorted_by_text(texts: &ByteTable) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..texts.ends.len() as u32).collect();
    ids.sort_unstable_by(|&a, &b| {
        texts
            .get(a as usize)
            .cmp(texts.get(b as usize))
            .then(a.cmp(&b))
    });
    ids
}

/// The merge table over ids: each merge's two parts and their concatenation must be tokens (as the
/// `tokenizers` crate requires too). Where a string occurs twice in the vocabulary the first id counts.
fn build_bpe<'m>(
    texts: &ByteTable,
    merges: impl Iterator<Item = Result<(&'m [u8], &'m [u8]), TokenizerError>>,
    n_merges: usize,
) -> Result<Bpe, TokenizerError> {
    let n = texts.ends.len();
    let mut id_of: HashMap<&[u8], u32> = HashMap::with_capacity(n);
    for i in 0..n {
        id_of.entry(texts.get(i)).or_insert(i as u32);
    }
    let mut byte_ids = [u32::MAX; 256];
    for (b, c) in byte_to_char_table().iter().enumerate() {
        let mut buf = [0u8; 4];
        if let Some(&id) = id_of.get(c.encode_utf8(&mut buf).as_bytes()) {
            byte_ids[b] = id;
        }
    }
    let mut table = Vec::with_capacity(n_merges);
    let mut joined = Vec::with_capacity(64);
    for (rank, merge) in merges.enumerate() {
        let (a, b) = merge?;
        joined.clear();
        joined.extend_from_slice(a);
        joined.extend_from_slice(b);
        let id = |t: &[u8]| {
            id_of.get(t).copied().ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "merge {rank} \"{} {}\": {:?} is not in the vocabulary",
                    String::from_utf8_lossy(a),
                    String::from_utf8_lossy(b),
                    String::from_utf8_lossy(t)
                ))
            })
        };
        table.push([id(a)?, id(b)?, rank as u32, id(&joined)?]);
    }
    Ok(Bpe::new(byte_ids, n, table))
}

/// Turns token ids into text as they are generated: emits only complete UTF-8, holding back the
/// start of a multi-byte character until its last byte arrives (a 4-byte emoji can come as four
/// byte tokens). Invalid bytes become U+FFFD.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    special: bool,
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// `special`: render CONTROL tokens (see [`Tokenizer::token_to_piece`]).
    pub fn new(special: bool) -> StreamDecoder {
        StreamDecoder {
            special,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let piece = tok.token_to_piece(id, self.special);
        self.push_bytes(&piece)
    }

    /// Adds raw bytes; returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let good = start + e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..good]).expect("validated"),
                    );
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            start = good;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = good + bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back, as U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xad], 'Ń');
        let inv = char_to_byte_table();
        for (b, c) in t.iter().enumerate() {
            assert_eq!(inv[*c as usize], b as i16);
        }
    }

    #[test]
    fn merge_split() {
        assert_eq!(parse_merge(b"a b"), Some((&b"a"[..], &b"b"[..])));
        assert_eq!(
            parse_merge("Ġ ĠĠ".as_bytes()),
            Some(("Ġ".as_bytes(), "ĠĠ".as_bytes()))
        );
        // A part may start with a space: the split is after the first byte.
        assert_eq!(parse_merge(b"  a"), Some((&b" "[..], &b"a"[..])));
        assert_eq!(parse_merge(b"ab"), None);
    }

    #[test]
    fn stream_decoder_holds_partial_chars() {
        let mut d = StreamDecoder::new(false);
        let e = "😀".as_bytes();
        assert_eq!(d.push_bytes(b"a"), "a");
        assert_eq!(d.push_bytes(&e[..1]), "");
        assert_eq!(d.push_bytes(&e[1..3]), "");
        assert_eq!(d.push_bytes(&e[3..]), "😀");
        assert_eq!(d.push_bytes(b"\xffb"), "\u{fffd}b");
        assert_eq!(d.push_bytes(&e[..2]), "");
        assert_eq!(d.flush(), "\u{fffd}");
        assert!(d.pending().is_empty());
    }

    fn tiny() -> Tokenizer {
        // Bytes a, b, c, space (Ġ) and merges "a b", "ab c", plus specials.
        let tokens = [
            "a",
            "b",
            "c",
            "Ġ",
            "ab",
            "abc",
            "<|im_start|>",
            "<tool>",
            "[PAD8]",
        ];
        let types = vec![
            TokenType::Normal,
            TokenType::Normal,
            TokenType::Normal,
            TokenType::Normal,
            TokenType::Normal,
            TokenType::Normal,
            TokenType::Control,
            TokenType::UserDefined,
            TokenType::Unused,
        ];
        Tokenizer::from_parts(
            &tokens,
            types,
            &[("a", "b"), ("ab", "c")],
            "qwen35",
            TokenizerIds {
                eos: Some(6),
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn merges_outside_the_vocabulary_are_errors() {
        let types = vec![TokenType::Normal; 3];
        let err = Tokenizer::from_parts(
            &["a", "b", "ab"],
            types.clone(),
            &[("a", "c")],
            "qwen35",
            TokenizerIds::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("merge 0 \"a c\": \"c\" is not in the vocabulary"),
            "{err}"
        );
        let err = Tokenizer::from_parts(
            &["a", "b"],
            types[..2].to_vec(),
            &[("a", "b")],
            "qwen35",
            TokenizerIds::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("\"ab\" is not in the vocabulary"), "{err}");
    }

    #[test]
    fn tiny_encode_decode() {
        let t = tiny();
        assert_eq!(t.encode("abc ab", false).unwrap(), vec![5, 3, 4]);
        assert_eq!(t.encode("<|im_start|>abc", true).unwrap(), vec![6, 5]);
        assert_eq!(t.encode("c<tool>a", false).unwrap(), vec![2, 7, 0]);
        assert_eq!(t.decode(&[5, 3, 6, 7, 8], false), "abc <tool>");
        assert_eq!(t.decode(&[5, 3, 6, 7, 8], true), "abc <|im_start|><tool>");
        assert!(t.is_eog(6));
        assert_eq!(t.special_id("<tool>"), Some(7));
    }
}
