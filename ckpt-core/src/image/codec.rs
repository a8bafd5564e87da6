//! Compression codecs of chunk data.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::ImageError;

/// How the IO threads compress chunk data. Parsed from and shown as `none`, `zstd`,
/// `zstd:LEVEL`, `auto` or `auto:LEVEL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    /// Store the bytes as they are: cheapest on CPU, best when the disk is fast or memory is
    /// incompressible.
    None,
    /// zstd at the given level (negative levels are zstd's fast modes).
    Zstd(i32),
    /// zstd at the given level where it pays: an IO thread compresses a chunk when compressing
    /// it and writing the result takes it less time than writing it raw, as it measures both
    /// (`pool::io::Pace`). On a disk faster than the compressor, chunks go raw; on a slower one,
    /// compressible chunks are compressed. Chunks written while the job is frozen (the `direct`
    /// writer) are never compressed.
    Auto(i32),
}

impl Codec {
    /// zstd's own default level; a good trade between speed and ratio for memory images.
    pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
    /// The level of `auto`: it competes with the disk's speed, where speed counts more than ratio
    /// (zstd:1 compressed memory 4.3:1 at 0.38 GB/s per thread here).
    pub const DEFAULT_AUTO_LEVEL: i32 = 1;

    /// The id written in chunk headers (the level is not needed to decompress).
    pub fn id(self) -> CodecId {
        match self {
            Codec::None => CodecId::None,
            Codec::Zstd(_) | Codec::Auto(_) => CodecId::Zstd,
        }
    }

    /// Whether chunks are compressed only where that is quicker than writing them raw.
    pub fn is_auto(self) -> bool {
        matches!(self, Codec::Auto(_))
    }

    /// Checks the zstd level against the range the linked zstd accepts.
    pub fn validate(self) -> Result<Self, ImageError> {
        if let Codec::Zstd(level) | Codec::Auto(level) = self {
            let range = zstd::compression_level_range();
            if !range.contains(&level) {
                return Err(ImageError::InvalidConfig {
                    what: "codec",
                    detail: format!("zstd level {level} is outside {}..={} (try zstd:3)", range.start(), range.end()),
                });
            }
        }
        Ok(self)
    }

    /// A validated codec's compressor: None for `none`, a zstd context at its level otherwise.
    pub fn compressor(self) -> Result<Option<zstd::bulk::Compressor<'static>>, ImageError> {
        match self.validate()? {
            Codec::None => Ok(None),
            Codec::Zstd(level) | Codec::Auto(level) => zstd::bulk::Compressor::new(level)
                .map(Some)
                .map_err(|e| ImageError::InvalidConfig { what: "codec", detail: format!("cannot create a zstd compressor at level {level}: {e}") }),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Zstd(level) => write!(f, "zstd:{level}"),
            Codec::Auto(level) => write!(f, "auto:{level}"),
        }
    }
}

impl FromStr for Codec {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ImageError::InvalidConfig { what: "codec", detail: format!("{s:?} (expected none, zstd, zstd:LEVEL, auto or auto:LEVEL, e.g. zstd:3)") };
        let codec = match s.trim() {
            "none" => Codec::None,
            "zstd" => Codec::Zstd(Self::DEFAULT_ZSTD_LEVEL),
            "auto" => Codec::Auto(Self::DEFAULT_AUTO_LEVEL),
            other => match other.split_once(':') {
                Some(("zstd", level)) => Codec::Zstd(level.parse().map_err(|_| bad())?),
                Some(("auto", level)) => Codec::Auto(level.parse().map_err(|_| bad())?),
                _ => return Err(bad()),
            },
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

/// What compressing a few samples of a chunk told: how much they shrank, and how fast.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// Bytes sampled, and what they compressed to.
    pub sampled: usize,
    pub compressed: usize,
    /// How long compressing them took.
    pub took: std::time::Duration,
}

impl Probe {
    /// Whether the samples shrank enough for the whole chunk to be worth compressing.
    pub fn shrinks(&self) -> bool {
        self.compressed * 100 <= self.sampled * (100 - MIN_GAIN_PERCENT)
    }

    /// Raw bytes per second the compressor took in.
    pub fn bytes_per_second(&self) -> f64 {
        self.sampled as f64 / self.took.as_secs_f64().max(1e-9)
    }

    /// Raw bytes per stored byte.
    pub fn ratio(&self) -> f64 {
        self.sampled as f64 / self.compressed.max(1) as f64
    }
}

/// Compresses a few samples spread over `data` (memory is often compressible in places only);
/// None when `data` is too small to sample or a sample failed (the whole compression then meets,
/// and reports, whatever went wrong). `scratch` is reused.
pub fn probe(compressor: &mut zstd::bulk::Compressor<'_>, data: &[u8], scratch: &mut Vec<u8>) -> Option<Probe> {
    if data.len() < 2 * PROBES * PROBE_LEN {
        return None;
    }
    scratch.clear();
    scratch.reserve(zstd::zstd_safe::compress_bound(PROBE_LEN));
    let step = data.len() / PROBES;
    let started = std::time::Instant::now();
    let mut compressed = 0usize;
    for k in 0..PROBES {
        let sample = &data[k * step..k * step + PROBE_LEN];
        compressed += compressor.compress_to_buffer(sample, scratch).ok()?;
        scratch.clear();
    }
    Some(Probe { sampled: PROBES * PROBE_LEN, compressed, took: started.elapsed() })
}

/// Whether compressing `data` whole is worth it: a few samples are compressed first, and a chunk
/// whose samples barely shrink (encrypted, already compressed or random memory) is stored raw
/// without paying for compressing all of it, which would cost about as much as the disk write
/// itself and gain nothing. Small chunks are always tried whole. `scratch` is reused.
pub fn worth_compressing(compressor: &mut zstd::bulk::Compressor<'_>, data: &[u8], scratch: &mut Vec<u8>) -> bool {
    probe(compressor, data, scratch).is_none_or(|p| p.shrinks())
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
        assert_eq!("auto".parse::<Codec>().unwrap(), Codec::Auto(1));
        assert_eq!("auto:-3".parse::<Codec>().unwrap(), Codec::Auto(-3));
        assert!("auto:1000".parse::<Codec>().is_err());
        assert!("auto:zstd".parse::<Codec>().is_err());
        for c in [Codec::None, Codec::Zstd(3), Codec::Zstd(-1), Codec::Auto(1)] {
            assert_eq!(c.to_string().parse::<Codec>().unwrap(), c);
        }
    }
}
