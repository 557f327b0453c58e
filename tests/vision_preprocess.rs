//! Image preprocessing against the transformers processor's outputs for tiny-v1's three test images
//! (`golden/img{0,1,2}_pixel_values.npy`, `img*_grid_thw.npy`, and the processor's resized images
//! `images/img*_resized.png`), plus decoding of other formats and malformed input.
//!
//! Tolerances (fixture README): img0 (no resize) ≤ 1e-6; img1 and img2 (torchvision bicubic resize)
//! ≤ 1 uint8 level (0.0079 in pixel_values) and ≥ 99.9 % of the values identical.
//!
//! The fixtures are copied (not committed) by `tools/fetch-fixtures.sh` into tests/fixtures/shared/.

use std::io::Cursor;
use std::path::PathBuf;
use std::time::Instant;

use deltaq::npy;
use deltaq::vision::preprocess::{
    decode_image, decode_image_with_limits, preprocess, preprocess_bytes, resize_bicubic_aa,
    smart_resize, DecodeLimits, PreprocessConfig, RgbImage, RELEASED_MAX_TOKENS,
};
use image::{DynamicImage, ImageBuffer, ImageFormat, Luma, LumaA, Rgb, Rgba};

fn fixture(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared/tiny-v1")
        .join(rel);
    assert!(
        p.exists(),
        "missing test fixture {}: run tools/fetch-fixtures.sh (copies it from ../shared/fixtures)",
        p.display()
    );
    p
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(fixture(rel)).unwrap()
}

/// The released processor's limits (64..16384 merged tokens): what the goldens were made with.
fn released() -> PreprocessConfig {
    PreprocessConfig::from_token_limits(64, RELEASED_MAX_TOKENS).unwrap()
}

#[test]
fn pixel_values_match_the_processor() {
    for (i, max_abs_allowed) in [(0, 1e-6), (1, 0.0079), (2, 0.0079)] {
        let img = decode_image(&read(&format!("images/img{i}.png"))).unwrap();
        let patches = preprocess(&img, &released()).unwrap();

        let grid = npy::read(&fixture(&format!("golden/img{i}_grid_thw.npy"))).unwrap();
        let grid: Vec<usize> = grid.data.iter().map(|&v| v as usize).collect();
        assert_eq!(patches.grid_thw().to_vec(), grid, "img{i} grid_thw");

        let golden = npy::read(&fixture(&format!("golden/img{i}_pixel_values.npy"))).unwrap();
        assert_eq!(
            golden.shape,
            vec![patches.n_patches(), 1536],
            "img{i} shape"
        );
        assert_eq!(patches.pixel_values.len(), golden.data.len());
        let mut max_abs = 0f64;
        let mut identical = 0usize;
        for (&ours, &theirs) in patches.pixel_values.iter().zip(&golden.data) {
            let d = (f64::from(ours) - theirs).abs();
            max_abs = max_abs.max(d);
            identical += usize::from(f64::from(ours) == theirs);
        }
        let share = identical as f64 / golden.data.len() as f64;
        println!(
            "img{i}: {}x{} -> grid {:?}, {} merged tokens; pixel_values max abs diff {max_abs:.3e}, \
             {identical} of {} identical ({:.4} %)",
            img.width(),
            img.height(),
            patches.grid_thw(),
            patches.n_merged_tokens(),
            golden.data.len(),
            100.0 * share
        );
        assert!(max_abs <= max_abs_allowed, "img{i}: max abs {max_abs}");
        assert!(
            share >= 0.999,
            "img{i}: only {:.4} % identical",
            100.0 * share
        );
        let from_bytes =
            preprocess_bytes(&read(&format!("images/img{i}.png")), &released()).unwrap();
        assert_eq!(from_bytes, patches);
    }
}

/// The resize on its own, against the processor's resized uint8 images (saved as PNG by the fixture
/// script): the arithmetic is PyTorch's, so every byte should agree.
#[test]
fn resize_matches_torchvision_bytes() {
    for i in 0..3 {
        let img = decode_image(&read(&format!("images/img{i}.png"))).unwrap();
        let reference = decode_image(&read(&format!("images/img{i}_resized.png"))).unwrap();
        let (h, w) = smart_resize(
            img.height() as usize,
            img.width() as usize,
            32,
            65536,
            16777216,
        )
        .unwrap();
        assert_eq!((w as u32, h as u32), reference.dimensions(), "img{i} size");
        let ours = resize_bicubic_aa(&img, w as u32, h as u32).unwrap();
        let differ = ours
            .as_raw()
            .iter()
            .zip(reference.as_raw())
            .filter(|(a, b)| a != b)
            .count();
        let max = ours
            .as_raw()
            .iter()
            .zip(reference.as_raw())
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap();
        println!(
            "img{i}: resized {}x{} -> {w}x{h}: {differ} of {} bytes differ from torchvision, max {max}",
            img.width(),
            img.height(),
            ours.as_raw().len()
        );
        assert_eq!(differ, 0, "img{i}: {differ} bytes differ (max {max})");
    }
}

fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// A small RGB test picture with gradients and edges.
fn picture(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        Rgb([
            (x * 255 / w.max(2)) as u8,
            (y * 255 / h.max(2)) as u8,
            if (x / 8 + y / 8) % 2 == 0 { 40 } else { 220 },
        ])
    })
}

#[test]
fn decodes_jpeg_and_webp() {
    let pic = picture(96, 64);
    // WebP (lossless, the encoder the image crate has): exact.
    let webp = encode(DynamicImage::ImageRgb8(pic.clone()), ImageFormat::WebP);
    assert_eq!(&webp[..4], b"RIFF");
    assert_eq!(decode_image(&webp).unwrap(), pic);
    // JPEG (lossy): same size, close pixels.
    let jpeg = encode(DynamicImage::ImageRgb8(pic.clone()), ImageFormat::Jpeg);
    assert_eq!(&jpeg[..2], &[0xff, 0xd8]);
    let back = decode_image(&jpeg).unwrap();
    assert_eq!(back.dimensions(), pic.dimensions());
    let mean_abs: f64 = back
        .as_raw()
        .iter()
        .zip(pic.as_raw())
        .map(|(&a, &b)| f64::from(a.abs_diff(b)))
        .sum::<f64>()
        / pic.as_raw().len() as f64;
    assert!(mean_abs < 6.0, "JPEG round trip mean abs {mean_abs}");
    // Grey JPEG -> replicated channels.
    let grey = ImageBuffer::from_fn(40, 30, |x, y| Luma([(x * 6 + y) as u8]));
    let back = decode_image(&encode(DynamicImage::ImageLuma8(grey), ImageFormat::Jpeg)).unwrap();
    assert!(back.pixels().all(|p| p[0] == p[1] && p[1] == p[2]));
    // Both go through preprocessing.
    let patches = preprocess(&decode_image(&webp).unwrap(), &PreprocessConfig::default()).unwrap();
    assert_eq!(patches.n_merged_tokens(), 70, "96x64 grows to 320x224");
}

/// Pillow's convert("RGB"), which transformers' convert_to_rgb is: alpha dropped (not composited),
/// grey replicated, 16-bit RGB(A) and grey+alpha by their high byte, 16-bit grey clipped at 255.
#[test]
fn converts_to_rgb_like_pillow() {
    let png = |img: DynamicImage| decode_image(&encode(img, ImageFormat::Png)).unwrap();

    let rgba = ImageBuffer::from_fn(4, 3, |x, y| {
        Rgba([x as u8 * 50, y as u8 * 80, 7, (x * 60) as u8])
    });
    let out = png(DynamicImage::ImageRgba8(rgba));
    assert_eq!(
        out.get_pixel(0, 2).0,
        [0, 160, 7],
        "transparent pixel keeps its colour"
    );
    assert_eq!(out.get_pixel(3, 1).0, [150, 80, 7]);

    let grey_alpha = ImageBuffer::from_fn(3, 3, |x, _| LumaA([x as u8 * 100, 0]));
    assert_eq!(
        png(DynamicImage::ImageLumaA8(grey_alpha)).get_pixel(2, 0).0,
        [200; 3]
    );

    let rgb16 = ImageBuffer::from_fn(2, 2, |x, y| {
        Rgb([0x12ff_u16, 0x8000 + x as u16, 0x00ff + y as u16])
    });
    assert_eq!(
        png(DynamicImage::ImageRgb16(rgb16)).get_pixel(1, 1).0,
        [0x12, 0x80, 0x01]
    );

    let rgba16 = ImageBuffer::from_fn(2, 2, |_, _| Rgba([0xffff_u16, 0x0100, 0x00ff, 0]));
    assert_eq!(
        png(DynamicImage::ImageRgba16(rgba16)).get_pixel(0, 0).0,
        [0xff, 0x01, 0x00]
    );

    let grey16 = ImageBuffer::from_fn(3, 1, |x, _| Luma([[100_u16, 255, 4000][x as usize]]));
    let out = png(DynamicImage::ImageLuma16(grey16));
    let values: Vec<[u8; 3]> = out.pixels().map(|p| p.0).collect();
    assert_eq!(values, vec![[100; 3], [255; 3], [255; 3]]);
}

/// A PNG chunk: length, type, data, CRC-32 of type and data.
fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut crc = 0xffff_ffff_u32;
    for &b in kind.iter().chain(data) {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&(!crc).to_be_bytes());
    out
}

/// A PNG whose header declares `w` x `h` (8-bit RGB or 16-bit RGBA) but whose data is a few bytes.
fn png_header_only(w: u32, h: u32, sixteen_bit_rgba: bool) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(if sixteen_bit_rgba {
        &[16, 6, 0, 0, 0]
    } else {
        &[8, 2, 0, 0, 0]
    });
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(png_chunk(b"IHDR", &ihdr));
    out.extend(png_chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    out.extend(png_chunk(b"IEND", &[]));
    out
}

#[test]
fn malformed_input_is_an_error() {
    let err = |bytes: &[u8]| format!("{:#}", decode_image(bytes).unwrap_err());

    let e = err(&[]);
    assert!(e.contains("empty"), "{e}");
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let e = err(&random);
    assert!(e.contains("unrecognised image format"), "{e}");
    // Formats whose decoders are not built in.
    let e = err(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;");
    assert!(e.contains("Gif") || e.contains("GIF"), "{e}");
    err(b"BM\x3a\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00");

    // Truncated PNG: the header decodes, the pixel data ends early.
    let png = read("images/img1.png");
    for keep in [8, 33, 100, png.len() / 2, png.len() - 13] {
        let e = err(&png[..keep]);
        println!("truncated PNG ({keep} of {} bytes): {e}", png.len());
    }
    // Truncated JPEG and WebP.
    let pic = DynamicImage::ImageRgb8(picture(64, 48));
    for format in [ImageFormat::Jpeg, ImageFormat::WebP] {
        let bytes = encode(pic.clone(), format);
        let e = err(&bytes[..bytes.len() / 2]);
        println!("truncated {format:?}: {e}");
    }

    // Decompression bombs: refused from the header, before any large allocation.
    let e = err(&png_header_only(100_000, 100_000, false));
    println!("100000x100000 PNG: {e}");
    assert!(e.contains("limit") || e.contains("dimensions"), "{e}");
    // Within the side limit but 16000 x 16000 x 8 bytes = 1953 MiB.
    let e = err(&png_header_only(16_000, 16_000, true));
    println!("16000x16000 RGBA16 PNG: {e}");
    assert!(e.contains("MiB"), "{e}");
    // A caller's tighter limits.
    let small = DecodeLimits {
        max_side: 100,
        max_alloc: 1 << 20,
    };
    assert!(decode_image_with_limits(&read("images/img2.png"), small).is_ok());
    assert!(decode_image_with_limits(&read("images/img0.png"), small).is_err());
    // Zero width.
    let e = err(&png_header_only(0, 10, false));
    println!("0x10 PNG: {e}");
}

#[test]
fn preprocess_refuses_extreme_aspect_ratios() {
    let thin = RgbImage::new(2010, 10);
    let e = preprocess(&thin, &PreprocessConfig::default()).unwrap_err();
    assert!(e.to_string().contains("aspect ratio"), "{e}");
}

/// Decode + preprocess time of a 1024x768 photo-sized image (PNG and JPEG; no resize needed, 768 tokens)
/// and of a 1000x750 JPEG (resized to 992x736). Printed, not asserted.
#[test]
fn timing_1024x768() {
    let cfg = PreprocessConfig::default();
    let cases = [
        (1024, 768, ImageFormat::Png),
        (1024, 768, ImageFormat::Jpeg),
        (1000, 750, ImageFormat::Jpeg),
    ];
    for (w, h, format) in cases {
        let bytes = encode(DynamicImage::ImageRgb8(picture(w, h)), format);
        let mut best = f64::MAX;
        let mut tokens = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let img = decode_image(&bytes).unwrap();
            let patches = preprocess(&img, &cfg).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            tokens = patches.n_merged_tokens();
        }
        println!(
            "{w}x{h} {format:?} ({} KiB): decode + preprocess {:.1} ms (best of 5, {} threads), {tokens} tokens",
            bytes.len() >> 10,
            best * 1e3,
            rayon::current_num_threads()
        );
    }
}
