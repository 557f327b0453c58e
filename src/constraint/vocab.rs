//! deltaq's vocabulary as llguidance sees it: every token id with the bytes it decodes to, in a
//! token trie. Control, user-defined and unused tokens are marked special (toktrie's 0xFF prefix), so
//! no grammar produces them as text; the end-of-generation tokens are allowed separately, only where
//! the grammar may end.

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::{TokenType, Tokenizer};

/// The token trie and the tokenizer llguidance uses to tokenize forced text.
pub(super) struct TokenEnv {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenEnv {
    /// `n_vocab`: the model's logits length (may exceed the tokenizer's: the rest never decode).
    pub(super) fn new(tok: &Tokenizer, n_vocab: usize) -> TokenEnv {
        let n = n_vocab.max(tok.n_vocab());
        let words: Vec<Vec<u8>> = (0..n as u32).map(|id| token_bytes(tok, id)).collect();
        let eos = tok
            .eos()
            .or_else(|| tok.eog_ids().first().copied())
            .unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tok.bos();
        info.tok_pad = tok.pad();
        TokenEnv {
            trie: TokTrie::from(&info, &words),
            tok: tok.clone(),
        }
    }
}

/// The bytes of a token for the trie: text for NORMAL and BYTE tokens, `0xFF` + the token's text for
/// the rest (never matched by grammar text), nothing for ids past the tokenizer.
fn token_bytes(tok: &Tokenizer, id: u32) -> Vec<u8> {
    match tok.token_type(id) {
        None => Vec::new(),
        Some(TokenType::Normal) | Some(TokenType::Byte) => {
            tok.token_to_piece(id, false).into_owned()
        }
        Some(_) => {
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
            b
        }
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tok
                .encode_with(text, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}
