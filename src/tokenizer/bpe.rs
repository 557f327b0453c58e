//! Byte-level BPE over token ids: the merge step of the tokenizer, on compact tables.
//!
//! A pre-tokenized word starts as one symbol per byte (the token of that byte's GPT-2 char) and the
//! adjacent pair with the best (lowest) merge rank is merged until no pair has a merge; ties go to the
//! leftmost pair. That is the rule of llama.cpp's `llm_tokenizer_bpe` and of the `tokenizers` crate's
//! BPE model (without dropout, cache or `ignore_merges`), on which the tests hold us.
//!
//! The merges are stored by left token, in compressed rows: for each left id, its merges sorted by
//! right id, 12 bytes per merge plus 4 per token (about 7 MB for Qwen3.5's 500k merges and 248k
//! tokens). A lookup reads two offsets and binary-searches the few merges of one token. The
//! `tokenizers` crate's model kept the merges in a hash map and the vocabulary twice as maps of heap
//! strings: about 75 MB for this vocabulary.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One merge of a left token: with `right` it becomes `merged`; `rank` orders merges (lower first).
#[derive(Clone, Copy, Debug)]
struct Merge {
    right: u32,
    rank: u32,
    merged: u32,
}

/// The merge table: `(left id, right id)` -> `(rank, merged id)`, in compressed rows by left id.
#[derive(Clone)]
pub(super) struct Bpe {
    /// The merges of left id `l` are `merges[starts[l]..starts[l + 1]]`, sorted by right id.
    starts: Vec<u32>,
    merges: Vec<Merge>,
    /// The token of each byte (the GPT-2 char that stands for it), `u32::MAX` if the vocabulary has
    /// none: such bytes are dropped, as the `tokenizers` crate does without an unknown token.
    byte_ids: [u32; 256],
}

/// A symbol of the word being merged: a token id and its neighbours (a linked list over the bytes).
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
    /// False once merged into its left neighbour.
    alive: bool,
}

const NONE: u32 = u32::MAX;

impl Bpe {
    /// `merges`: `[left, right, rank, merged]` ids, in any order, every id below `n_vocab`. Where a
    /// pair is listed twice the better (lower) rank counts, as in llama.cpp.
    pub(super) fn new(byte_ids: [u32; 256], n_vocab: usize, mut merges: Vec<[u32; 4]>) -> Bpe {
        merges.sort_unstable();
        merges.dedup_by(|b, a| a[0] == b[0] && a[1] == b[1]);
        let mut starts = Vec::with_capacity(n_vocab + 1);
        let mut rows = Vec::with_capacity(merges.len());
        let mut next = merges.iter().peekable();
        for left in 0..n_vocab as u32 {
            starts.push(rows.len() as u32);
            while let Some(&[_, right, rank, merged]) = next.next_if(|m| m[0] == left) {
                rows.push(Merge {
                    right,
                    rank,
                    merged,
                });
            }
        }
        starts.push(rows.len() as u32);
        debug_assert!(next.next().is_none(), "a merge's left id is out of range");
        Bpe {
            starts,
            merges: rows,
            byte_ids,
        }
    }

    /// `(rank, merged id)` of the pair, if it merges.
    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        let l = left as usize;
        let row = &self.merges[self.starts[l] as usize..self.starts[l + 1] as usize];
        let i = row.binary_search_by_key(&right, |m| m.right).ok()?;
        Some((row[i].rank, row[i].merged))
    }

    /// Appends the tokens of one pre-tokenized word (raw bytes) to `out`.
    pub(super) fn encode_word(&self, word: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        let BpeScratch { symbols, queue } = scratch;
        symbols.clear();
        for &b in word {
            let id = self.byte_ids[b as usize];
            if id == NONE {
                continue;
            }
            let i = symbols.len() as u32;
            symbols.push(Symbol {
                id,
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
                alive: true,
            });
        }
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = NONE;
        if symbols.len() > 1 {
            self.merge_all(symbols, queue);
        }
        let mut i = 0;
        while i != NONE {
            out.push(symbols[i as usize].id);
            i = symbols[i as usize].next;
        }
    }

    /// Merges best-rank-first. The queue holds `(rank, position, merged id)` candidates, the lowest
    /// rank first and, within a rank, the leftmost; one that went stale (its left symbol was merged
    /// away, or its right neighbour changed) is skipped.
    fn merge_all(&self, symbols: &mut [Symbol], queue: &mut BinaryHeap<Reverse<(u32, u32, u32)>>) {
        queue.clear();
        for (pos, w) in symbols.windows(2).enumerate() {
            if let Some((rank, merged)) = self.get(w[0].id, w[1].id) {
                queue.push(Reverse((rank, pos as u32, merged)));
            }
        }
        while let Some(Reverse((_, pos, merged))) = queue.pop() {
            let left = symbols[pos as usize];
            if !left.alive || left.next == NONE {
                continue;
            }
            let right = symbols[left.next as usize];
            if self.get(left.id, right.id).map(|m| m.1) != Some(merged) {
                continue;
            }
            // Merge `right` into `left`.
            symbols[left.next as usize].alive = false;
            symbols[pos as usize].id = merged;
            symbols[pos as usize].next = right.next;
            if right.next != NONE {
                symbols[right.next as usize].prev = pos;
            }
            // The new pairs with both neighbours.
            if left.prev != NONE {
                let prev = symbols[left.prev as usize].id;
                if let Some((rank, m)) = self.get(prev, merged) {
                    queue.push(Reverse((rank, left.prev, m)));
                }
            }
            if right.next != NONE {
                let next = symbols[right.next as usize].id;
                if let Some((rank, m)) = self.get(merged, next) {
                    queue.push(Reverse((rank, pos, m)));
                }
            }
        }
    }
}

/// Scratch for [`Bpe::encode_word`], reused across the words of a text.
#[derive(Default)]
pub(super) struct BpeScratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<(u32, u32, u32)>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens 0..3 are the bytes a, b, c; the rest come from `merges` (`[left, right, rank, merged]`).
    fn encode(merges: &[[u32; 4]], n_vocab: usize, word: &[u8]) -> Vec<u32> {
        let mut byte_ids = [NONE; 256];
        for (id, b) in [b'a', b'b', b'c'].into_iter().enumerate() {
            byte_ids[b as usize] = id as u32;
        }
        let bpe = Bpe::new(byte_ids, n_vocab, merges.to_vec());
        let mut out = Vec::new();
        bpe.encode_word(word, &mut BpeScratch::default(), &mut out);
        out
    }

    #[test]
    fn best_rank_first_then_leftmost() {
        // 3 = ab, 4 = bc, 5 = abc (as a+bc), 6 = abc (as ab+c).
        let ab_first = [[0, 1, 0, 3], [1, 2, 1, 4], [3, 2, 2, 6], [0, 4, 3, 5]];
        assert_eq!(encode(&ab_first, 7, b"abc"), vec![6]);
        let bc_first = [[0, 1, 1, 3], [1, 2, 0, 4], [3, 2, 2, 6], [0, 4, 3, 5]];
        assert_eq!(encode(&bc_first, 7, b"abc"), vec![5]);
        // Equal ranks can only come from one pair; "aaa" with a+a: the leftmost pair merges.
        let aa = [[0, 0, 0, 3]];
        assert_eq!(encode(&aa, 4, b"aaa"), vec![3, 0]);
        assert_eq!(encode(&aa, 4, b"aaaa"), vec![3, 3]);
        // A listed-twice pair keeps its better rank; bytes without a token are dropped.
        let twice = [[1, 2, 5, 3], [0, 1, 1, 4], [1, 2, 0, 3]];
        assert_eq!(encode(&twice, 5, b"abc"), vec![0, 3]);
        assert_eq!(encode(&[], 3, b"axb"), vec![0, 1]);
        assert_eq!(encode(&[], 3, b""), Vec::<u32>::new());
    }
}
