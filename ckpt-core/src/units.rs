//! Sizes as people write them on command lines (`--pool 1G`, `--chunk 16M`).

/// Parses sizes such as 4096, 64K, 256M, 1G, 1.5G.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let unit = s[i..].trim_end_matches(['B', 'b', 'i']).to_ascii_uppercase();
            let mult = match unit.as_str() {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], mult)
        }
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("not a size: {s:?}"))?;
    if v < 0.0 {
        return Err(format!("negative size {s:?}"));
    }
    Ok((v * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("12X").is_err());
    }
}
