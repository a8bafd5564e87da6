//! Fuzzes everything that reads an image before acting on it: record files (procs.bin,
//! files.bin, index.bin) through decoding and validation, the manifest, and chunk headers. Checksums are made right for the
//! forged bytes where the mode says so, so that the fuzzer reaches past the checksum layer into
//! the decoder and the validation step. Every input must give an error or a value; a panic, an
//! overflow (debug assertions are on under cargo fuzz) or a huge allocation is a bug.
//!
//! The first byte of an input chooses what the rest is (its value modulo 10, below).
//! scripts/fuzz.sh (run by scripts/test.sh, and so by CI) makes a seed corpus from real images
//! and runs this target for a bounded time; by hand, from the repository's root:
//! `cargo fuzz run image --sanitizer none` (any toolchain; `cargo +nightly fuzz run image` for
//! AddressSanitizer too).

#![no_main]

use std::path::Path;

use ckpt_core::image::{record, ChunkHeader, Manifest, PartIndex, CHUNK_HEADER_LEN, FORMAT_VERSION};
use ckpt_core::objects::files_state::{FilesRecord, FILES_MAGIC};
use ckpt_core::snapshot::{NodeImage, PROCS_MAGIC};
use ckpt_core::validate::forge::{mutate, sample_image, tweak, Rng};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 10 {
        // A procs file as it is on disk: header checks, checksum, decoding, validation.
        0 => drop(NodeImage::from_bytes(rest, Path::new("procs.bin"))),
        // A procs payload with a header and checksum made right for it.
        1 => drop(NodeImage::from_bytes(&record::encode_record(PROCS_MAGIC, rest), Path::new("procs.bin"))),
        // A real record, changed by a mutation script that the input seeds: reaches the
        // validation step far more often than raw bytes do.
        2 => {
            let mut payload = postcard::to_stdvec(&sample_image()).unwrap_or_default();
            let mut seed = [0u8; 8];
            for (i, b) in rest.iter().take(8).enumerate() {
                seed[i] = *b;
            }
            let mut rng = Rng(u64::from_le_bytes(seed) | 1);
            for _ in 0..1 + rest.len() % 8 {
                mutate(&mut payload, &mut rng);
            }
            drop(NodeImage::from_bytes(&record::encode_record(PROCS_MAGIC, &payload), Path::new("procs.bin")));
        }
        // A real record with forged fields (edge values, bad paths, elements duplicated,
        // swapped or dropped), straight into validation.
        5 => {
            let mut img = sample_image();
            for chunk in rest.chunks(8).take(16) {
                let mut seed = [0u8; 8];
                seed[..chunk.len()].copy_from_slice(chunk);
                tweak(&mut img, &mut Rng(u64::from_le_bytes(seed) | 1));
            }
            drop(ckpt_core::validate::node_image(&img));
        }
        // A manifest body, under a first line whose checksum holds.
        3 => {
            let mut file = format!("CKPT-MANIFEST {FORMAT_VERSION} crc32c={:08x}\n", crc32c::crc32c(rest)).into_bytes();
            file.extend_from_slice(rest);
            drop(Manifest::from_bytes(&file, Path::new("MANIFEST")));
            drop(Manifest::from_bytes(rest, Path::new("MANIFEST")));
        }
        // A chunk header, its own checksum made right.
        4 => {
            let mut h = [0u8; CHUNK_HEADER_LEN];
            let n = rest.len().min(CHUNK_HEADER_LEN);
            h[..n].copy_from_slice(&rest[..n]);
            let crc = crc32c::crc32c(&h[..52]);
            h[52..56].copy_from_slice(&crc.to_le_bytes());
            drop(ChunkHeader::parse(&h, Path::new("p2-0000000000000000")));
        }
        // A files record (files.bin) as it is on disk.
        6 => drop(FilesRecord::from_bytes(rest, Path::new("files.bin"))),
        // A files record's payload, with a header and checksum made right for it.
        7 => drop(FilesRecord::from_bytes(&record::encode_record(FILES_MAGIC, rest), Path::new("files.bin"))),
        // A node index (index.bin) as it is on disk, checked as the index of the node and
        // generation it names (so that the checks of its files are reached).
        8 => index_as_its_own(rest),
        // A node index's payload, with a header and checksum made right for it.
        9 => index_as_its_own(&record::encode_record(*b"CKPTINDX", rest)),
        _ => {}
    }
});

fn index_as_its_own(bytes: &[u8]) {
    let path = Path::new("index.bin");
    if let Ok(index) = record::decode_record::<PartIndex>(bytes, path, *b"CKPTINDX", 64 << 20) {
        drop(PartIndex::from_bytes(bytes, path, index.generation, &index.node));
    }
}
