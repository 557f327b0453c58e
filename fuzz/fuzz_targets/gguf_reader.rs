//! Any byte string given to the GGUF reader yields a file or an error: never a panic, hang or huge allocation.
#![no_main]

use deltaq::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_bytes(data.to_vec()) {
        for (_, v) in f.metadata() {
            if let Some(a) = v.as_array() {
                for e in a.iter() {
                    std::hint::black_box(e);
                }
            }
        }
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.nbytes);
        }
        std::hint::black_box(f.is_ggml_strict_layout());
    }
});
