//! Prompts with images (spec §3.6, §8): token ids in which each image is a run of `<|image_pad|>`
//! tokens whose rows take the image's embeddings (from the vision tower) instead of the token's, and
//! the M-RoPE positions of every token.
//!
//! ```text
//! text token at index i:                 (p, p, p),       p = the running position
//! image of rows × cols starting at p0:   (p0, p0 + row, p0 + col), row-major over the merged grid
//! text after the image:                  continues at p0 + max(rows, cols)
//! ```
//!
//! (transformers' `get_rope_index`, llama.cpp's mtmd M-RoPE positions.) A [`Prompt`] always describes
//! a sequence from its first token: the positions of its later tokens depend on everything before.

use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};

use crate::tokenizer::Tokenizer;

/// One image's embeddings as the vision tower emits them: `[rows·cols × d]`, row-major over the merged
/// grid of `rows × cols` tokens.
#[derive(Clone, Debug)]
pub struct ImageEmbd {
    rows: usize,
    cols: usize,
    embd: Vec<f32>,
    id: u64,
}

impl ImageEmbd {
    /// `embd`: `[rows·cols × d]`. Its identity for prompt caching ([`ImageEmbd::id`]) is a hash of the
    /// embeddings and the grid; [`ImageEmbd::with_id`] sets another (e.g. [`content_id`] of the image
    /// file, known before the tower runs).
    pub fn new(embd: Vec<f32>, rows: usize, cols: usize) -> Result<ImageEmbd> {
        let n = rows.checked_mul(cols).unwrap_or(0);
        ensure!(
            n > 0,
            "an image needs a non-empty grid, not {rows} × {cols}"
        );
        ensure!(
            !embd.is_empty() && embd.len().is_multiple_of(n),
            "image embeddings of {} values do not split into {rows} × {cols} = {n} rows",
            embd.len()
        );
        let mut h = fnv1a(FNV_OFFSET, &(rows as u64).to_le_bytes());
        h = fnv1a(h, &(cols as u64).to_le_bytes());
        for x in &embd {
            h = fnv1a(h, &x.to_bits().to_le_bytes());
        }
        Ok(ImageEmbd {
            rows,
            cols,
            embd,
            id: h,
        })
    }

    /// The same image with identity `id`: images with equal ids are taken to be the same image.
    pub fn with_id(mut self, id: u64) -> ImageEmbd {
        self.id = id;
        self
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Merged grid rows × columns.
    pub fn grid(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Tokens (embedding rows) of the image: `rows · cols`.
    pub fn n_tokens(&self) -> usize {
        self.rows * self.cols
    }

    /// Embedding width `d`.
    pub fn width(&self) -> usize {
        self.embd.len() / self.n_tokens()
    }

    /// Embedding of token `r` (`[d]`).
    pub fn row(&self, r: usize) -> &[f32] {
        let d = self.width();
        &self.embd[r * d..][..d]
    }
}

/// A piece of a prompt.
#[derive(Clone, Debug)]
pub enum Segment {
    Text(Vec<u32>),
    /// An image: `image.n_tokens()` tokens `pad_token` (`<|image_pad|>`) whose rows are the image's.
    Image {
        image: Arc<ImageEmbd>,
        pad_token: u32,
    },
}

/// A token sequence from its start, with images: what [`Session::forward_prompt`] and its siblings
/// feed (any range of it, in order).
///
/// [`Session::forward_prompt`]: super::Session::forward_prompt
#[derive(Clone, Debug)]
pub struct Prompt {
    tokens: Vec<u32>,
    /// `[T]`: the (t, h, w) position of every token.
    pos: Vec<[u32; 3]>,
    /// The images in order, each with the index of its first token.
    images: Vec<(usize, Arc<ImageEmbd>)>,
}

impl Prompt {
    /// A prompt of text only (positions = indices).
    pub fn text(tokens: Vec<u32>) -> Result<Prompt> {
        Prompt::build(tokens, Vec::new())
    }

    /// The segments in order.
    pub fn new(segments: impl IntoIterator<Item = Segment>) -> Result<Prompt> {
        let (mut tokens, mut images) = (Vec::new(), Vec::new());
        for s in segments {
            match s {
                Segment::Text(t) => tokens.extend_from_slice(&t),
                Segment::Image { image, pad_token } => {
                    let n = image.n_tokens();
                    images.push((tokens.len(), image));
                    tokens.resize(tokens.len() + n, pad_token);
                }
            }
        }
        Prompt::build(tokens, images)
    }

    /// From token ids in which the images are already expanded (what the chat template plus the
    /// processor give): every maximal run of `pad_token` takes the next image of `images`, and its
    /// length must be that image's token count.
    pub fn from_tokens(
        tokens: Vec<u32>,
        pad_token: u32,
        images: impl IntoIterator<Item = Arc<ImageEmbd>>,
    ) -> Result<Prompt> {
        let mut images = images.into_iter();
        let mut placed = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            if tokens[i] != pad_token {
                i += 1;
                continue;
            }
            let run = tokens[i..].iter().take_while(|&&t| t == pad_token).count();
            let k = placed.len();
            let Some(image) = images.next() else {
                bail!("image placeholder {k} (a run of {run} image pad tokens at index {i}) has no image");
            };
            ensure!(
                run == image.n_tokens(),
                "image {k}: {run} image pad tokens at index {i}, but the image has {} × {} = {} embeddings",
                image.rows,
                image.cols,
                image.n_tokens()
            );
            placed.push((i, image));
            i += run;
        }
        let extra = images.count();
        ensure!(
            extra == 0,
            "{} images for {} image placeholders in the tokens",
            placed.len() + extra,
            placed.len()
        );
        Prompt::build(tokens, placed)
    }

    fn build(tokens: Vec<u32>, images: Vec<(usize, Arc<ImageEmbd>)>) -> Result<Prompt> {
        ensure!(
            tokens.len() < i32::MAX as usize,
            "prompt of {} tokens is too long",
            tokens.len()
        );
        let mut pos = Vec::with_capacity(tokens.len());
        let mut next = 0u32;
        let text_to = |pos: &mut Vec<[u32; 3]>, next: &mut u32, end: usize| {
            while pos.len() < end {
                pos.push([*next; 3]);
                *next += 1;
            }
        };
        for (start, image) in &images {
            text_to(&mut pos, &mut next, *start);
            let (rows, cols) = (image.rows as u32, image.cols as u32);
            for r in 0..rows {
                for c in 0..cols {
                    pos.push([next, next + r, next + c]);
                }
            }
            next += rows.max(cols);
        }
        text_to(&mut pos, &mut next, tokens.len());
        Ok(Prompt {
            tokens,
            pos,
            images,
        })
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// `[T]`: the (t, h, w) M-RoPE position of every token.
    pub fn positions(&self) -> &[[u32; 3]] {
        &self.pos
    }

    /// The images with the index of their first token.
    pub fn images(&self) -> &[(usize, Arc<ImageEmbd>)] {
        &self.images
    }

    /// Whether tokens `range` include image rows.
    pub fn has_image_in(&self, range: std::ops::Range<usize>) -> bool {
        self.images
            .iter()
            .any(|(s, im)| *s < range.end && range.start < s + im.n_tokens())
    }

    /// The image containing token `i` and the row of `i` in it.
    fn image_at(&self, i: usize) -> Option<(&ImageEmbd, usize)> {
        let k = self.images.partition_point(|(s, _)| *s <= i);
        let (s, im) = self.images.get(k.checked_sub(1)?)?;
        (i < s + im.n_tokens()).then(|| (&**im, i - s))
    }

    /// The embedding that replaces token `i`'s (`[d]`), if `i` is an image row.
    pub fn embedding(&self, i: usize) -> Option<&[f32]> {
        self.image_at(i).map(|(im, r)| im.row(r))
    }

    /// The position a text token after the first `i` tokens takes: the last position + 1 after text,
    /// `p0 + max(rows, cols)` after an image's rows (its last one or, midway, any).
    pub fn next_position(&self, i: usize) -> usize {
        if i == 0 {
            return 0;
        }
        match self.image_at(i - 1) {
            Some((im, r)) => self.pos[i - 1 - r][0] as usize + im.rows.max(im.cols),
            None => self.pos[i - 1][0] as usize + 1,
        }
    }

    /// One key per token for prompt caching: the token id for text; for an image row, a hash of the
    /// image's id and the row with the top bit set, so that it never equals a token id. A cached
    /// prefix therefore matches across an image only if it is the same image.
    pub fn cache_key(&self) -> Vec<u64> {
        (0..self.len())
            .map(|i| match self.image_at(i) {
                Some((im, r)) => fnv1a(im.id, &(r as u64).to_le_bytes()) | 1 << 63,
                None => self.tokens[i] as u64,
            })
            .collect()
    }
}

/// Where an image goes in a chat text (llama.cpp's mtmd marker).
pub const MEDIA_MARKER: &str = "<__media__>";

/// The one-turn ChatML prompt `llama-mtmd-cli` builds by default (no Jinja template):
///
/// ```text
/// <|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n
/// ```
///
/// with each [`MEDIA_MARKER`] in `user` replaced by `<|vision_start|>` + the image's `<|image_pad|>`
/// rows + `<|vision_end|>`, images in order; without markers the images go before the text. Tokenized
/// as llama.cpp does (special tokens in the text parsed).
pub fn image_chat_prompt(
    tok: &Tokenizer,
    user: &str,
    images: Vec<Arc<ImageEmbd>>,
) -> Result<Prompt> {
    let markers = user.matches(MEDIA_MARKER).count();
    let user = match markers {
        0 => MEDIA_MARKER.repeat(images.len()) + user,
        n if n == images.len() => user.to_string(),
        n => bail!(
            "the chat text has {n} image markers ({MEDIA_MARKER}) for {} images",
            images.len()
        ),
    };
    let text = format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n");
    prompt_with_media(tok, &text, images)
}

/// `text` (e.g. a rendered chat template) with each [`MEDIA_MARKER`] replaced by `<|vision_start|>` +
/// the next image's `<|image_pad|>` rows + `<|vision_end|>`, tokenized with special tokens parsed. The
/// markers must match the images in number.
pub fn prompt_with_media(
    tok: &Tokenizer,
    text: &str,
    images: Vec<Arc<ImageEmbd>>,
) -> Result<Prompt> {
    let markers = text.matches(MEDIA_MARKER).count();
    ensure!(
        markers == images.len(),
        "the text has {markers} image markers ({MEDIA_MARKER}) for {} images",
        images.len()
    );
    if images.is_empty() {
        return Prompt::text(tok.encode(text, true).context("tokenizing the chat text")?);
    }
    let image = "<|vision_start|><|image_pad|><|vision_end|>";
    let text = text.replace(MEDIA_MARKER, image);
    let pad = tok
        .special_id("<|image_pad|>")
        .context("the vocabulary has no <|image_pad|> token")?;
    let ids = tok
        .encode(&text, true)
        .context("tokenizing the chat text")?;
    // One pad per image in the text: expanded to the image's rows.
    let mut tokens =
        Vec::with_capacity(ids.len() + images.iter().map(|im| im.n_tokens()).sum::<usize>());
    let mut k = 0;
    for id in ids {
        if id != pad {
            tokens.push(id);
            continue;
        }
        let im = images.get(k).with_context(|| {
            format!(
                "the chat text holds more than the {} images' pad tokens",
                images.len()
            )
        })?;
        tokens.resize(tokens.len() + im.n_tokens(), pad);
        k += 1;
    }
    Prompt::from_tokens(tokens, pad, images)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `bytes`, continuing from `h`: a stable, dependency-free hash for identities.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// An identity for the image in `bytes` (e.g. the file), for [`ImageEmbd::with_id`]: lets a server
/// recognise an image it has seen before running the vision tower on it.
pub fn content_id(bytes: &[u8]) -> u64 {
    fnv1a(FNV_OFFSET, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(rows: usize, cols: usize, d: usize, seed: f32) -> Arc<ImageEmbd> {
        let embd = (0..rows * cols * d).map(|i| seed + i as f32).collect();
        Arc::new(ImageEmbd::new(embd, rows, cols).unwrap())
    }

    #[test]
    fn positions_follow_get_rope_index() {
        // 2 text, a 2 × 3 image, 2 text, a 3 × 1 image at the end.
        let p = Prompt::new([
            Segment::Text(vec![1, 2]),
            Segment::Image {
                image: image(2, 3, 4, 0.0),
                pad_token: 9,
            },
            Segment::Text(vec![3, 4]),
            Segment::Image {
                image: image(3, 1, 4, 0.5),
                pad_token: 9,
            },
        ])
        .unwrap();
        let want: Vec<[u32; 3]> = vec![
            [0, 0, 0],
            [1, 1, 1],
            [2, 2, 2],
            [2, 2, 3],
            [2, 2, 4],
            [2, 3, 2],
            [2, 3, 3],
            [2, 3, 4],
            [5, 5, 5],
            [6, 6, 6],
            [7, 7, 7],
            [7, 8, 7],
            [7, 9, 7],
        ];
        assert_eq!(p.positions(), &want[..]);
        assert_eq!(p.tokens()[2..8], [9; 6]);
        let next: Vec<usize> = (0..=p.len()).map(|i| p.next_position(i)).collect();
        assert_eq!(next, [0, 1, 2, 5, 5, 5, 5, 5, 5, 6, 7, 10, 10, 10]);
        assert_eq!(p.embedding(1), None);
        assert_eq!(p.embedding(3).unwrap(), &[4.0, 5.0, 6.0, 7.0]);
        assert_eq!(p.embedding(12).unwrap(), &[8.5, 9.5, 10.5, 11.5]);
        assert!(p.has_image_in(7..8) && !p.has_image_in(8..10) && p.has_image_in(9..11));

        // The same prompt from expanded tokens.
        let q = Prompt::from_tokens(
            p.tokens().to_vec(),
            9,
            [image(2, 3, 4, 0.0), image(3, 1, 4, 0.5)],
        )
        .unwrap();
        assert_eq!(q.positions(), p.positions());
        assert_eq!(q.cache_key(), p.cache_key());
    }

    #[test]
    fn placeholders_must_match_images() {
        let toks = vec![1, 9, 9, 9, 2];
        let e = Prompt::from_tokens(toks.clone(), 9, [image(2, 2, 4, 0.0)]).unwrap_err();
        assert!(e.to_string().contains("3 image pad tokens"), "{e}");
        let e = Prompt::from_tokens(toks.clone(), 9, []).unwrap_err();
        assert!(e.to_string().contains("has no image"), "{e}");
        let e =
            Prompt::from_tokens(toks, 9, [image(3, 1, 4, 0.0), image(1, 1, 4, 0.0)]).unwrap_err();
        assert!(e.to_string().contains("2 images for 1"), "{e}");
        assert!(ImageEmbd::new(vec![0.0; 10], 2, 2).is_err());
        assert!(ImageEmbd::new(vec![0.0; 8], 0, 2).is_err());
    }

    #[test]
    fn cache_keys_tell_images_apart() {
        let with = |im| {
            Prompt::new([
                Segment::Text(vec![5]),
                Segment::Image {
                    image: im,
                    pad_token: 9,
                },
                Segment::Text(vec![6]),
            ])
            .unwrap()
            .cache_key()
        };
        let (a, b) = (with(image(1, 2, 4, 0.0)), with(image(1, 2, 4, 1.0)));
        assert_eq!(a, with(image(1, 2, 4, 0.0)));
        assert_eq!((a[0], a[3]), (5, 6));
        assert_eq!(a[0], b[0]);
        assert!(a[1] != b[1] && a[2] != b[2] && a[1] != a[2]);
        assert!(a[1..3].iter().all(|&k| k >= 1 << 63));
        // An id set from the image file overrides the embeddings' hash.
        let c = with(Arc::new(
            ImageEmbd::new(vec![0.0; 8], 1, 2)
                .unwrap()
                .with_id(content_id(b"png")),
        ));
        let d = with(Arc::new(
            ImageEmbd::new(vec![1.0; 8], 1, 2)
                .unwrap()
                .with_id(content_id(b"png")),
        ));
        assert_eq!(c, d);
    }
}
