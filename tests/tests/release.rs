//! The release binary for older systems (issue 35, §4): `scripts/build-release.sh` links `ckpt`
//! against glibc 2.28 (RHEL 8, the oldest glibc of the clusters ckpt is for), and it must ask
//! for no symbol version newer than that. The binary checked is `$CKPT_RELEASE_BIN`, else the
//! script's output; scripts/test.sh builds it first, and runs end-to-end tests with it.

use std::path::PathBuf;

/// The highest glibc this binary may need.
const OLDEST_GLIBC: (u32, u32) = (2, 28);

fn release_binary() -> PathBuf {
    let bin = std::env::var_os("CKPT_RELEASE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/x86_64-unknown-linux-gnu/release/ckpt"));
    assert!(bin.is_file(), "{} does not exist: build it with scripts/build-release.sh (scripts/test.sh does)", bin.display());
    bin
}

/// `GLIBC_2.28` -> (2, 28).
fn glibc_version(name: &str) -> Option<(u32, u32)> {
    let (major, minor) = name.strip_prefix("GLIBC_")?.split_once('.')?;
    let minor = minor.split('.').next()?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[test]
fn the_release_binary_needs_glibc_2_28_at_most() {
    let bin = release_binary();
    let bytes = std::fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let elf = goblin::elf::Elf::parse(&bytes).unwrap_or_else(|e| panic!("{} is not an ELF file: {e}", bin.display()));
    let needs = elf.verneed.as_ref().expect("a dynamically linked binary lists the symbol versions it needs");
    let mut versions: Vec<(u32, u32)> = Vec::new();
    for need in needs.iter() {
        for aux in need.iter() {
            if let Some(v) = elf.dynstrtab.get_at(aux.vna_name).and_then(glibc_version) {
                versions.push(v);
            }
        }
    }
    let newest = versions.iter().max().copied().expect("the binary needs some glibc version");
    assert!(
        newest <= OLDEST_GLIBC,
        "{} needs GLIBC_{}.{}, newer than {}.{}: a libc function newer than that crept in (call it through libc::syscall, or find which with `objdump -T`)",
        bin.display(),
        newest.0,
        newest.1,
        OLDEST_GLIBC.0,
        OLDEST_GLIBC.1
    );
    let out = std::process::Command::new(&bin).arg("--version").output().expect("the release binary runs");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("ckpt "), "{} --version: {out:?}", bin.display());
    eprintln!("{}: needs GLIBC_{}.{} at most", bin.display(), newest.0, newest.1);
}
