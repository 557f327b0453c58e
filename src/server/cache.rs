//! The prompt cache: session snapshots (KV cache + conv + recurrent state) keyed by the exact token
//! sequence they have processed, bounded in bytes, least recently used evicted first.
//!
//! The recurrent state of the DeltaNet layers cannot be rolled back, so a snapshot is only usable by a
//! prompt that starts with exactly its tokens; the request then clones it and feeds the rest.

use std::sync::Arc;

use crate::model::Session;

/// A stored snapshot.
struct Entry {
    tokens: Vec<u64>,
    session: Arc<Session<'static>>,
    /// Logits after the last token, so that a prompt equal to `tokens` needs no forward pass.
    logits: Option<Arc<Vec<f32>>>,
    bytes: usize,
    last_used: u64,
}

/// What a lookup found: the snapshot covers `prompt[..len]`.
pub struct Hit {
    pub len: usize,
    pub session: Arc<Session<'static>>,
    pub logits: Option<Arc<Vec<f32>>>,
}

/// Counters reported by `/health`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheStats {
    pub entries: usize,
    pub bytes: usize,
    pub capacity_bytes: usize,
    pub hits: u64,
    pub misses: u64,
    /// Prompt tokens served from snapshots instead of being processed.
    pub hit_tokens: u64,
    pub evictions: u64,
}

pub struct PromptCache {
    entries: Vec<Entry>,
    capacity: usize,
    bytes: usize,
    tick: u64,
    hits: u64,
    misses: u64,
    hit_tokens: u64,
    evictions: u64,
}

impl PromptCache {
    pub fn new(capacity_bytes: usize) -> PromptCache {
        PromptCache {
            entries: Vec::new(),
            capacity: capacity_bytes,
            bytes: 0,
            tick: 0,
            hits: 0,
            misses: 0,
            hit_tokens: 0,
            evictions: 0,
        }
    }

    fn entry_bytes(tokens: &[u64], session: &Session<'_>, logits: Option<&Vec<f32>>) -> usize {
        session.state_bytes()
            + std::mem::size_of_val(tokens)
            + logits.map_or(0, |l| std::mem::size_of_val(l.as_slice()))
    }

    /// The longest snapshot whose tokens are a prefix of `prompt` and that leaves at least one token
    /// to feed (or carries the logits of its last position).
    pub fn lookup(&mut self, prompt: &[u64]) -> Option<Hit> {
        self.tick += 1;
        let best = self
            .entries
            .iter_mut()
            .filter(|e| {
                prompt.starts_with(&e.tokens)
                    && !e.tokens.is_empty()
                    && (e.tokens.len() < prompt.len() || e.logits.is_some())
            })
            .max_by_key(|e| e.tokens.len());
        match best {
            Some(e) => {
                e.last_used = self.tick;
                self.hits += 1;
                self.hit_tokens += e.tokens.len() as u64;
                Some(Hit {
                    len: e.tokens.len(),
                    session: e.session.clone(),
                    logits: e.logits.clone(),
                })
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Stores a snapshot (cloned by the caller, outside the lock) that has processed exactly `tokens`.
    /// A snapshot larger than the whole capacity is not stored.
    pub fn insert(
        &mut self,
        tokens: &[u64],
        session: Arc<Session<'static>>,
        logits: Option<&Vec<f32>>,
    ) {
        self.tick += 1;
        if tokens.is_empty() || self.capacity == 0 {
            return;
        }
        if self.touch(tokens, logits) {
            return;
        }
        let bytes = Self::entry_bytes(tokens, &session, logits);
        if bytes > self.capacity {
            return;
        }
        self.evict_to(self.capacity - bytes);
        self.bytes += bytes;
        self.entries.push(Entry {
            tokens: tokens.to_vec(),
            session,
            logits: logits.map(|l| Arc::new(l.clone())),
            bytes,
            last_used: self.tick,
        });
    }

    /// If a snapshot of exactly `tokens` is stored, marks it used (and gives it `logits` if it has
    /// none) and returns true: the caller need not clone its session.
    pub fn touch(&mut self, tokens: &[u64], logits: Option<&Vec<f32>>) -> bool {
        self.tick += 1;
        let Some(e) = self.entries.iter_mut().find(|e| e.tokens == tokens) else {
            return false;
        };
        e.last_used = self.tick;
        if let (None, Some(l)) = (&e.logits, logits) {
            let b = std::mem::size_of_val(l.as_slice());
            self.bytes += b;
            e.bytes += b;
            e.logits = Some(Arc::new(l.clone()));
            self.evict_to(self.capacity);
        }
        true
    }

    /// Evicts least recently used entries until at most `limit` bytes are held.
    fn evict_to(&mut self, limit: usize) {
        while self.bytes > limit {
            let Some((i, _)) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
            else {
                break;
            };
            let e = self.entries.swap_remove(i);
            self.bytes -= e.bytes;
            self.evictions += 1;
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.entries.len(),
            bytes: self.bytes,
            capacity_bytes: self.capacity,
            hits: self.hits,
            misses: self.misses,
            hit_tokens: self.hit_tokens,
            evictions: self.evictions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::model::Model;

    const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny-kjv-mtp-Q8_0.gguf");

    #[test]
    fn longest_prefix_lru_and_byte_bound() {
        let f: &'static GgufFile = Box::leak(Box::new(GgufFile::open(DEMO).unwrap()));
        let model: &'static Model<'static> = Box::leak(Box::new(Model::load(f).unwrap()));
        let snap = |key: &[u64]| {
            let tokens: Vec<u32> = key.iter().map(|&t| t as u32).collect();
            let mut s = Session::new(model, Some(64));
            s.feed(&tokens).unwrap();
            Arc::new(s)
        };
        let (a, ab, c): (Vec<u64>, Vec<u64>, Vec<u64>) =
            (vec![1, 2, 3], vec![1, 2, 3, 4, 5], vec![7, 8, 9]);
        let one = PromptCache::entry_bytes(&a, &snap(&a), None);
        // Room for two three-token snapshots (the five-token one is a little larger).
        let mut cache = PromptCache::new(2 * one + one / 2);
        cache.insert(&a, snap(&a), None);
        cache.insert(&ab, snap(&ab), None);
        assert_eq!(cache.stats().entries, 2);
        // The longest prefix wins; a prompt equal to a snapshot without logits is not served by it.
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5, 6]).unwrap().len, 5);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5]).unwrap().len, 3);
        assert!(cache.lookup(&[1, 2]).is_none());
        // `a` was used last: inserting `c` evicts `ab`.
        cache.insert(&c, snap(&c), None);
        let st = cache.stats();
        assert_eq!((st.entries, st.evictions), (2, 1));
        assert!(st.bytes <= st.capacity_bytes);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5, 6]).unwrap().len, 3);
        // Logits make an exact match usable.
        cache.touch(&c, Some(&vec![0.0; 4]));
        assert_eq!(cache.lookup(&c).unwrap().len, 3);
        // A snapshot larger than the whole capacity is not stored.
        let mut small = PromptCache::new(one / 2);
        small.insert(&a, snap(&a), None);
        assert_eq!(small.stats().entries, 0);
        let st = cache.stats();
        assert_eq!((st.hits, st.misses), (4, 1));
    }
}
