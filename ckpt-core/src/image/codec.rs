//! Compression codecs of chunk data.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::ImageError;

/// How the IO threads compress chunk data. Parsed from and shown as `none`, `zstd` or `zstd:LEVEL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    /// Store the bytes as they are: cheapest on CPU, best when the disk is fast or memory is
    /// incompressible.
    None,
    /// zstd at the given level (negative levels are zstd's fast modes).
    Zstd(i32),
}

impl Codec {
    /// zstd's own default level; a good trade between speed and ratio for memory images.
    pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

    /// The id written in chunk headers (the level is not needed to decompress).
    pub fn id(self) -> CodecId {
        match self {
            Codec::None => CodecId::None,
            Codec::Zstd(_) => CodecId::Zstd,
        }
    }

    /// Checks the zstd level against the range the linked zstd accepts.
    pub fn validate(self) -> Result<Self, ImageError> {
        if let Codec::Zstd(level) = self {
            let range = zstd::compression_level_range();
            if !range.contains(&level) {
                return Err(ImageError::InvalidConfig {
                    what: "codec",
                    detail: format!(
                        "zstd level {level} is outside {}..={} (try zstd:3)",
                        range.start(),
                        range.end()
                    ),
                });
            }
        }
        Ok(self)
    }

    /// A validated codec's compressor: None for `none`, a zstd context at its level otherwise.
    pub fn compressor(self) -> Result<Option<zstd::bulk::Compressor<'static>>, ImageError> {
        match self.validate()? {
            Codec::None => Ok(None),
            Codec::Zstd(level) => zstd::bulk::Compressor::new(level).map(Some).map_err(|e| ImageError::InvalidConfig {
                what: "codec",
                detail: format!("cannot create a zstd compressor at level {level}: {e}"),
            }),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Codec {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ImageError::InvalidConfig {
            what: "codec",
            detail: format!("{s:?} (expected none, zstd or zstd:LEVEL, e.g. zstd:3)"),
        };
        let codec = match s.trim() {
            "none" => Codec::None,
            "zstd" => Codec::Zstd(Self::DEFAULT_ZSTD_LEVEL),
            other => {
                let level = other.strip_prefix("zstd:").ok_or_else(bad)?;
                Codec::Zstd(level.parse().map_err(|_| bad())?)
            }
        };
        codec.validate()
    }
}

/// Bytes compressed from each of the [`PROBES`] samples before a whole chunk is.
const PROBE_LEN: usize = 16 * 1024;
/// Samples taken, evenly spread over the chunk: memory is often compressible in places only.
const PROBES: usize = 4;
/// A chunk is compressed whole only if its samples shrank by at least this many percent.
const MIN_GAIN_PERCENT: usize = 5;

/// Whether compressing `data` whole is worth it: a few samples are compressed first, and a chunk
/// whose samples barely shrink (encrypted, already compressed or random memory) is stored raw
/// without paying for compressing all of it, which would cost about as much as the disk write
/// itself and gain nothing. Small chunks are always tried whole. `scratch` is reused.
pub fn worth_compressing(compressor: &mut zstd::bulk::Compressor<'_>, data: &[u8], scratch: &mut Vec<u8>) -> bool {
    if data.len() < 2 * PROBES * PROBE_LEN {
        return true;
    }
    scratch.clear();
    scratch.reserve(zstd::zstd_safe::compress_bound(PROBE_LEN));
    let step = data.len() / PROBES;
    let mut compressed = 0usize;
    for k in 0..PROBES {
        let sample = &data[k * step..k * step + PROBE_LEN];
        match compressor.compress_to_buffer(sample, scratch) {
            Ok(n) => compressed += n,
            // Let the whole compression meet (and report) whatever went wrong.
            Err(_) => return true,
        }
        scratch.clear();
    }
    compressed * 100 <= PROBES * PROBE_LEN * (100 - MIN_GAIN_PERCENT)
}

/// The codec of one stored chunk, as recorded in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u32)]
pub enum CodecId {
    None = 0,
    Zstd = 1,
}

impl CodecId {
    pub fn from_u32(v: u32) -> Option<CodecId> {
        match v {
            0 => Some(CodecId::None),
            1 => Some(CodecId::Zstd),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_skip_incompressible_chunks_only() {
        let mut c = zstd::bulk::Compressor::new(1).unwrap();
        let mut scratch = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(!worth_compressing(&mut c, &random, &mut scratch));
        let text: Vec<u8> = b"step 12345 of the computation\n".iter().copied().cycle().take(1 << 20).collect();
        assert!(worth_compressing(&mut c, &text, &mut scratch));
        // Compressible in its second half only: a sample lands there.
        let mixed: Vec<u8> = random[..1 << 19].iter().chain(&text[..1 << 19]).copied().collect();
        assert!(worth_compressing(&mut c, &mixed, &mut scratch));
        // Too small to sample: tried whole.
        assert!(worth_compressing(&mut c, &random[..4096], &mut scratch));
    }

    #[test]
    fn parse_and_show() {
        assert_eq!("none".parse::<Codec>().unwrap(), Codec::None);
        assert_eq!("zstd".parse::<Codec>().unwrap(), Codec::Zstd(3));
        assert_eq!("zstd:19".parse::<Codec>().unwrap(), Codec::Zstd(19));
        assert_eq!("zstd:-5".parse::<Codec>().unwrap(), Codec::Zstd(-5));
        assert!("zstd:1000".parse::<Codec>().is_err());
        assert!("lz4".parse::<Codec>().is_err());
        assert!("zstd:".parse::<Codec>().is_err());
        for c in [Codec::None, Codec::Zstd(3), Codec::Zstd(-1)] {
            assert_eq!(c.to_string().parse::<Codec>().unwrap(), c);
        }
    }
}
