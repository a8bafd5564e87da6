//! XOR redundancy (`ckpt coordinator --redundancy xor:K`, SCR's layout, seed 000): the nodes
//! are split into groups of K; in a group, any one member's part can be rebuilt from the others'
//! parts and their parity pieces, at 1/(K-1) of a part's size of extra storage per node.
//!
//! A member's part, as a byte stream, is its files but the records (which the shared directory
//! keeps), in the manifest's order. In a group of `k` members whose longest stream is `L`, every
//! stream is padded with zeros to `(k-1) * seg` bytes, `seg = ceil(L / (k-1))`, and cut into
//! `k-1` segments. Member `i` keeps the parity `P_i`, the XOR of one segment of every other
//! member: segment `j` of member `m` goes into `P_h` with `h = (m + j + 1) mod k`
//! ([`holder_of`]). So every member sends `k-1` segments (its whole part) and keeps one
//! segment's worth. When member `x` is lost, its segment `j` is `P_h` XOR the segments of the
//! other members that went into `P_h` ([`rebuild_sources`]); `P_x` itself is not needed.
//! Two lost members of one group cannot be rebuilt.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::manifest::SHARED_RECORDS;
use super::record::FileEntry;

/// The groups of `nodes` (in this order) for groups of `k`: consecutive runs of `k`; a last run
/// of one node joins the group before it (a group of one has nobody to keep its parity).
pub fn groups(nodes: &[String], k: usize) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = nodes.chunks(k.max(2)).map(|c| c.to_vec()).collect();
    if out.len() > 1 && out.last().is_some_and(|g| g.len() == 1) {
        let last = out.pop().expect("checked");
        out.last_mut().expect("checked").extend(last);
    }
    out
}

/// Which member keeps the parity that segment `j` of member `m` goes into, in a group of `k`.
pub fn holder_of(m: usize, j: usize, k: usize) -> usize {
    (m + j + 1) % k
}

/// The segment size of a group whose members' streams are `lens` bytes long.
pub fn segment_len(lens: &[u64]) -> u64 {
    let k = lens.len() as u64;
    let longest = lens.iter().copied().max().unwrap_or(0);
    if k < 2 {
        return longest;
    }
    longest.div_ceil(k - 1)
}

/// To rebuild segment `j` of lost member `x` in a group of `k`: the member whose parity holds it,
/// and for every other member still there, which of its segments to XOR in (member, segment).
pub fn rebuild_sources(x: usize, j: usize, k: usize) -> (usize, Vec<(usize, usize)>) {
    let h = holder_of(x, j, k);
    let others = (0..k).filter(|&m| m != x && m != h).map(|m| (m, (h + k - m - 1) % k)).collect();
    (h, others)
}

/// The files of `node`'s part that make its stream: of the part's files (`PartFiles::of`), all
/// but its records, in the order they are listed (the order the node wrote them).
pub fn stream_files(part: &[FileEntry], node: &str) -> Vec<FileEntry> {
    let prefix = format!("{node}/");
    part.iter().filter(|f| f.path.strip_prefix(&prefix).is_some_and(|inner| !SHARED_RECORDS.contains(&inner))).cloned().collect()
}

/// The stream of a part: its files, in order, read from `part_dir` (their paths are
/// `<node>/...`, relative to the generation), as one sequence of bytes followed by zeros without
/// end; [`Read::take`] it to the length wanted.
pub struct PartStream {
    files: std::vec::IntoIter<(PathBuf, u64)>,
    current: Option<io::Take<File>>,
}

impl PartStream {
    pub fn open(part_dir: &Path, node: &str, files: &[FileEntry]) -> io::Result<PartStream> {
        let prefix = format!("{node}/");
        let mut list = Vec::new();
        for f in files {
            let inner = f.path.strip_prefix(&prefix).ok_or_else(|| io::Error::other(format!("{} is not in node {node}'s part", f.path)))?;
            list.push((part_dir.join(inner), f.size));
        }
        Ok(PartStream { files: list.into_iter(), current: None })
    }

    /// Skips the first `n` bytes.
    pub fn skip(&mut self, n: u64) -> io::Result<()> {
        io::copy(&mut self.by_ref().take(n), &mut io::sink()).map(drop)
    }
}

impl Read for PartStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(cur) = &mut self.current {
                let n = cur.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
                if cur.limit() > 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a file of the part is shorter than listed"));
                }
                self.current = None;
            }
            match self.files.next() {
                Some((path, size)) => {
                    let f = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
                    self.current = Some(f.take(size));
                }
                None => {
                    // Past the end: the zeros that pad the stream to whole segments.
                    buf.fill(0);
                    return Ok(buf.len());
                }
            }
        }
    }
}

/// Writes a part's stream back into its files under `part_dir`, checking each file's crc32c;
/// bytes past the listed files (padding) are dropped. [`PartWriter::finish`] makes it durable.
pub struct PartWriter {
    part_dir: PathBuf,
    node: String,
    files: std::vec::IntoIter<FileEntry>,
    current: Option<(File, FileEntry, u64, u32)>,
    dirs: std::collections::BTreeSet<PathBuf>,
}

impl PartWriter {
    #[allow(clippy::unnecessary_to_owned)] // the writer keeps its own list to walk
    pub fn new(part_dir: &Path, node: &str, files: &[FileEntry]) -> PartWriter {
        PartWriter { part_dir: part_dir.to_path_buf(), node: node.to_string(), files: files.to_vec().into_iter(), current: None, dirs: Default::default() }
    }

    fn next_file(&mut self) -> io::Result<bool> {
        let Some(f) = self.files.next() else { return Ok(false) };
        let inner = f
            .path
            .strip_prefix(&format!("{}/", self.node))
            .ok_or_else(|| io::Error::other(format!("{} is not in node {}'s part", f.path, self.node)))?
            .to_string();
        let path = self.part_dir.join(inner);
        let dir = path.parent().unwrap_or(&self.part_dir).to_path_buf();
        super::fsutil::create_private_dirs(&dir)?;
        self.dirs.insert(dir);
        let file = super::fsutil::open_private_file(&path, true).map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", path.display())))?;
        self.current = Some((file, f, 0, 0));
        Ok(true)
    }

    fn close_current(&mut self) -> io::Result<()> {
        if let Some((file, f, _, crc)) = self.current.take() {
            if crc != f.crc32c {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} rebuilt with crc32c {crc:08x}, the manifest says {:08x}", f.path, f.crc32c),
                ));
            }
            file.sync_all()?;
        }
        Ok(())
    }

    /// Every file written whole and checked, and durable with its directories.
    pub fn finish(mut self) -> io::Result<()> {
        if let Some((_, f, written, _)) = &self.current {
            if *written < f.size {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} rebuilt short ({written} of {} bytes)", f.path, f.size)));
            }
        }
        self.close_current()?;
        if let Some(f) = self.files.next() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} was not rebuilt", f.path)));
        }
        self.dirs.insert(self.part_dir.clone());
        for d in &self.dirs {
            File::open(d)?.sync_all()?;
        }
        Ok(())
    }
}

impl Write for PartWriter {
    fn write(&mut self, mut buf: &[u8]) -> io::Result<usize> {
        let total = buf.len();
        while !buf.is_empty() {
            if self.current.as_ref().is_none_or(|(_, f, written, _)| *written == f.size) {
                self.close_current()?;
                if !self.next_file()? {
                    // Padding.
                    return Ok(total);
                }
                continue;
            }
            let (file, f, written, crc) = self.current.as_mut().expect("a file is open");
            let n = buf.len().min((f.size - *written) as usize);
            file.write_all(&buf[..n])?;
            *crc = crc32c::crc32c_append(*crc, &buf[..n]);
            *written += n as u64;
            buf = &buf[n..];
        }
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `acc ^= other`, byte by byte.
pub fn xor_into(acc: &mut [u8], other: &[u8]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a ^= b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn groups_of_k_and_a_lone_last_node_joins_the_one_before() {
        assert_eq!(groups(&names(6), 3).iter().map(|g| g.len()).collect::<Vec<_>>(), vec![3, 3]);
        assert_eq!(groups(&names(7), 3).iter().map(|g| g.len()).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(groups(&names(8), 3).iter().map(|g| g.len()).collect::<Vec<_>>(), vec![3, 3, 2]);
        assert_eq!(groups(&names(2), 4).iter().map(|g| g.len()).collect::<Vec<_>>(), vec![2]);
    }

    /// Every member's segments go to every other member once; the parity of the group rebuilds
    /// any one lost member, byte for byte, for streams of different lengths.
    #[test]
    #[allow(clippy::needless_range_loop)] // x is a member number as well as an index
    fn any_one_member_is_rebuilt_from_the_others_and_the_parity() {
        for k in 2..=5 {
            let streams: Vec<Vec<u8>> = (0..k).map(|m| (0..(1000 + 37 * m)).map(|i| (i * 7 + m * 13) as u8).collect()).collect();
            let lens: Vec<u64> = streams.iter().map(|s| s.len() as u64).collect();
            let seg = segment_len(&lens) as usize;
            let segment = |m: usize, j: usize| -> Vec<u8> {
                let mut s = streams[m].clone();
                s.resize(seg * (k - 1), 0);
                s[j * seg..(j + 1) * seg].to_vec()
            };
            let mut parity = vec![vec![0u8; seg]; k];
            for m in 0..k {
                let mut holders: Vec<usize> = (0..k - 1).map(|j| holder_of(m, j, k)).collect();
                for j in 0..k - 1 {
                    xor_into(&mut parity[holder_of(m, j, k)], &segment(m, j));
                }
                holders.sort();
                assert_eq!(holders, (0..k).filter(|&i| i != m).collect::<Vec<_>>(), "k={k}: member {m}'s segments go to every other member once");
            }
            for x in 0..k {
                let mut rebuilt = Vec::new();
                for j in 0..k - 1 {
                    let (h, others) = rebuild_sources(x, j, k);
                    let mut s = parity[h].clone();
                    for (m, sj) in others {
                        xor_into(&mut s, &segment(m, sj));
                    }
                    rebuilt.extend(s);
                }
                rebuilt.truncate(streams[x].len());
                assert_eq!(rebuilt, streams[x], "k={k}: member {x} rebuilt");
            }
        }
    }

    #[test]
    fn a_part_read_as_a_stream_and_written_back() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("chunks")).unwrap();
        let mut files = Vec::new();
        for (name, len) in [("chunks/a", 3000usize), ("chunks/b", 10)] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            std::fs::write(src.join(name), &data).unwrap();
            files.push(FileEntry { path: format!("n1/{name}"), size: len as u64, crc32c: crc32c::crc32c(&data) });
        }
        let mut stream = Vec::new();
        PartStream::open(&src, "n1", &files).unwrap().take(4000).read_to_end(&mut stream).unwrap();
        assert_eq!(stream.len(), 4000);
        assert!(stream[3010..].iter().all(|&b| b == 0), "padded with zeros");
        let out = dir.path().join("out");
        let mut w = PartWriter::new(&out, "n1", &files);
        w.write_all(&stream).unwrap();
        w.finish().unwrap();
        assert_eq!(std::fs::read(out.join("chunks/a")).unwrap(), std::fs::read(src.join("chunks/a")).unwrap());
        // A damaged byte is found by the crc32c.
        stream[5] ^= 1;
        let mut w = PartWriter::new(&dir.path().join("bad"), "n1", &files);
        let r = w.write_all(&stream).and_then(|_| w.finish());
        assert!(r.is_err());
    }
}
