//! What a job needs of the CPU, checked before a restart on another one (issue 35, §2): the
//! register sets its threads hold, and the instruction set extensions the checkpoint's CPU had.
//!
//! **Registers.** A thread's `XState` is the kernel's NT_X86_XSTATE buffer: the legacy 512 bytes (x87, SSE),
//! then the XSAVE header, whose first 8 bytes (XSTATE_BV, at 512) say which components hold
//! state, then each component at this CPU's offset. A restart on a CPU without a component the
//! thread uses would lose registers the program relies on (and libraries picked their code by
//! the CPU at start: the program would stop with SIGILL), so it is refused first, naming the
//! component, before any process exists ([`check`]). A CPU with the same components at other
//! offsets (Intel keeps MPX's place before AVX-512, AMD does not) gets each component moved to
//! its offset here ([`to_layout`], from the CPUID 0xD leaves both CPUs' records hold); where that
//! cannot be done (an image without those leaves, a component of another size) the restart is
//! refused when the state is put back, saying so ([`size_refused`]).
//!
//! **Extensions.** Libraries choose their code by the CPU once, at start (glibc's memcpy,
//! BLAS kernels, a JIT): a program that started on a CPU with AVX2 keeps calling AVX2 code, and
//! on a CPU without it stops with SIGILL, whatever registers it held at the checkpoint. Each
//! checkpoint records the CPUID leaves that say which extensions there are ([`CpuRecord`]), and
//! a restart on a CPU without one of them is refused naming it ([`check_extensions`]), unless
//! told to take that risk (`--ignore-cpu`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::objects::ProcessRecord;

/// Where XSTATE_BV sits in the buffer.
const XSTATE_BV_AT: usize = 512;

/// The names of the XSAVE components by bit (the Intel SDM's, as Linux's
/// `xfeature_names` spells them, shortened).
fn component_name(bit: u32) -> &'static str {
    match bit {
        0 => "x87",
        1 => "SSE",
        2 => "AVX (YMM_Hi128)",
        3 => "MPX bounds registers",
        4 => "MPX bounds configuration",
        5 => "AVX-512 opmask",
        6 => "AVX-512 (ZMM_Hi256)",
        7 => "AVX-512 (Hi16_ZMM)",
        9 => "protection keys (PKRU)",
        17 => "AMX tile configuration",
        18 => "AMX tile data",
        _ => "an XSAVE component",
    }
}

/// The components a thread's state holds (its XSTATE_BV); 0 for a buffer too short to say.
pub fn components_in_use(buf: &[u8]) -> u64 {
    buf.get(XSTATE_BV_AT..XSTATE_BV_AT + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// The components of `in_use` that `here` (this CPU's XCR0) lacks, by name (pure).
pub fn lacking(in_use: u64, here: u64) -> Vec<String> {
    let missing = in_use & !here;
    (0..64).filter(|b| missing & (1u64 << b) != 0).map(|b| format!("{} (bit {b})", component_name(b))).collect()
}

/// Refuses a restart on a CPU that lacks a component some thread's state holds, naming the
/// thread and the component (pure but for `here`, this CPU's XCR0; `None` where it cannot be
/// read, as on a CPU without XSAVE: then nothing is checked).
pub fn check_registers(processes: &[ProcessRecord], here: Option<u64>) -> Result<()> {
    let Some(here) = here else { return Ok(()) };
    for p in processes {
        for t in &p.threads {
            let lacks = lacking(components_in_use(&t.xstate.0), here);
            if !lacks.is_empty() {
                return Err(Error::Other(format!(
                    "pid {} thread {} holds {} state, which this CPU lacks: restart on a CPU with the features of the one that took the checkpoint",
                    p.pid,
                    t.tid,
                    lacks.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// The refusal when this kernel takes another size of extended state for the thread than the
/// checkpoint's CPU gave (`saved` bytes against `here`): another CPU model's layout.
pub fn size_refused(tid: i32, saved: usize, here: usize, why: &str) -> Error {
    Error::Other(format!(
        "thread {tid}: the checkpoint's CPU saved {saved} bytes of extended register state (XSAVE) and this one takes {here}, and they cannot be moved to this layout ({why}): restart on a CPU of the same model"
    ))
}

/// One CPUID answer: (leaf, subleaf) → eax, ebx, ecx, edx.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuidLeaf {
    pub leaf: u32,
    pub sub: u32,
    pub regs: [u32; 4],
}

/// The checkpoint's CPU: its vendor and the CPUID leaves that list the extensions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuRecord {
    pub vendor: String,
    pub leaves: Vec<CpuidLeaf>,
}

/// The leaves recorded: features (1), structured extended features (7.0, 7.1), extended
/// features (0x80000001), and where each XSAVE component from AVX on lies in the saved state
/// (0xD.2 to 0xD.18: size in eax, offset in ebx), to move a thread's registers to another CPU's
/// layout ([`to_layout`]).
const LEAVES: [(u32, u32); 21] = [
    (1, 0),
    (7, 0),
    (7, 1),
    (0x8000_0001, 0),
    (0xd, 2),
    (0xd, 3),
    (0xd, 4),
    (0xd, 5),
    (0xd, 6),
    (0xd, 7),
    (0xd, 8),
    (0xd, 9),
    (0xd, 10),
    (0xd, 11),
    (0xd, 12),
    (0xd, 13),
    (0xd, 14),
    (0xd, 15),
    (0xd, 16),
    (0xd, 17),
    (0xd, 18),
];

/// The legacy area (x87, SSE) and the XSAVE header: the same on every CPU.
const LEGACY_AND_HEADER: usize = 576;

/// Where the kernel writes, in the legacy area, what it says of the layout (sw_reserved: the
/// components and size it saved): taken from this CPU's own state.
const SW_RESERVED: std::ops::Range<usize> = 464..512;

/// Whether a component `buf` holds lies elsewhere on this CPU than on the checkpoint's (pure).
/// An image whose record lacks the 0xD leaves (format 21 before they were recorded) cannot
/// say: not moved, as before.
pub fn layout_differs(buf: &[u8], from: &CpuRecord, here: &CpuRecord) -> bool {
    let in_use = components_in_use(buf);
    let place = |cpu: &CpuRecord, bit: u32| cpu.leaves.iter().find(|l| (l.leaf, l.sub) == (0xd, bit)).map(|l| (l.regs[0], l.regs[1]));
    (2..64).filter(|b| in_use & (1u64 << b) != 0).any(|b| matches!((place(from, b), place(here, b)), (Some(a), Some(h)) if a != h))
}

/// A thread's saved extended state `buf`, in the layout of the checkpoint's CPU `from`, moved to
/// the layout of this CPU (`here`, and `template`: a state this kernel gave, of the size it
/// takes). Each component in use moves from its old offset to its new one; the two CPUs must
/// agree on its size. Pure; `Err` says why it cannot be moved.
pub fn to_layout(buf: &[u8], from: &CpuRecord, here: &CpuRecord, template: &[u8]) -> std::result::Result<Vec<u8>, String> {
    if buf.len() < LEGACY_AND_HEADER || template.len() < LEGACY_AND_HEADER {
        return Err(format!("a saved state of {} bytes, too short for an XSAVE area", buf.len()));
    }
    let in_use = components_in_use(buf);
    let mut out = vec![0u8; template.len()];
    out[..SW_RESERVED.start].copy_from_slice(&buf[..SW_RESERVED.start]);
    out[SW_RESERVED].copy_from_slice(&template[SW_RESERVED]);
    // The header: the components in use, standard (not compacted) form.
    out[XSTATE_BV_AT..XSTATE_BV_AT + 8].copy_from_slice(&in_use.to_le_bytes());
    for bit in (2..64).filter(|b| in_use & (1u64 << b) != 0) {
        let place = |cpu: &CpuRecord| cpu.leaves.iter().find(|l| (l.leaf, l.sub) == (0xd, bit)).map(|l| (l.regs[1] as usize, l.regs[0] as usize));
        let (Some((old_at, old_len)), Some((new_at, new_len))) = (place(from), place(here)) else {
            return Err(format!("where the checkpoint's CPU or this one keeps {} is not known", component_name(bit)));
        };
        if old_len != new_len || old_len == 0 {
            return Err(format!("{} is {old_len} bytes on the checkpoint's CPU and {new_len} here", component_name(bit)));
        }
        let (Some(src), Some(dst)) = (buf.get(old_at..old_at + old_len), out.get_mut(new_at..new_at + new_len)) else {
            return Err(format!("{} lies outside the saved state", component_name(bit)));
        };
        dst.copy_from_slice(src);
    }
    Ok(out)
}

/// The extensions compared, by name: (name, leaf, subleaf, register 0..=3 for eax..edx, bit).
/// Those programs and libraries choose code by.
const EXTENSIONS: &[(&str, u32, u32, usize, u32)] = &[
    ("SSE3", 1, 0, 2, 0),
    ("PCLMULQDQ", 1, 0, 2, 1),
    ("SSSE3", 1, 0, 2, 9),
    ("FMA", 1, 0, 2, 12),
    ("SSE4.1", 1, 0, 2, 19),
    ("SSE4.2", 1, 0, 2, 20),
    ("MOVBE", 1, 0, 2, 22),
    ("POPCNT", 1, 0, 2, 23),
    ("AES", 1, 0, 2, 25),
    ("AVX", 1, 0, 2, 28),
    ("F16C", 1, 0, 2, 29),
    ("RDRAND", 1, 0, 2, 30),
    ("BMI1", 7, 0, 1, 3),
    ("AVX2", 7, 0, 1, 5),
    ("BMI2", 7, 0, 1, 8),
    ("ERMS", 7, 0, 1, 9),
    ("AVX512F", 7, 0, 1, 16),
    ("AVX512DQ", 7, 0, 1, 17),
    ("RDSEED", 7, 0, 1, 18),
    ("ADX", 7, 0, 1, 19),
    ("AVX512IFMA", 7, 0, 1, 21),
    ("AVX512CD", 7, 0, 1, 28),
    ("SHA", 7, 0, 1, 29),
    ("AVX512BW", 7, 0, 1, 30),
    ("AVX512VL", 7, 0, 1, 31),
    ("AVX512VBMI", 7, 0, 2, 1),
    ("GFNI", 7, 0, 2, 8),
    ("VAES", 7, 0, 2, 9),
    ("VPCLMULQDQ", 7, 0, 2, 10),
    ("AVX512VNNI", 7, 0, 2, 11),
    ("AVX512BITALG", 7, 0, 2, 12),
    ("AVX512VPOPCNTDQ", 7, 0, 2, 14),
    ("FSRM", 7, 0, 3, 4),
    ("AMX-BF16", 7, 0, 3, 22),
    ("AMX-TILE", 7, 0, 3, 24),
    ("AMX-INT8", 7, 0, 3, 25),
    ("AVX-VNNI", 7, 1, 0, 4),
    ("AVX512BF16", 7, 1, 0, 5),
    ("LZCNT", 0x8000_0001, 0, 2, 5),
];

impl CpuRecord {
    /// This CPU, less the extensions the test hook `CKPT_TEST_CPU_LACKS` names: read once per
    /// process (every checkpoint records it while the job is frozen).
    pub fn here() -> &'static CpuRecord {
        static HERE: std::sync::OnceLock<CpuRecord> = std::sync::OnceLock::new();
        HERE.get_or_init(Self::read)
    }

    fn read() -> CpuRecord {
        let (max, vendor) = crate::sys::cpu::vendor();
        let max_ext = crate::sys::cpu::cpuid(0x8000_0000, 0)[0];
        let lacks = crate::sys::cpu::test_lacks_names();
        let leaves = LEAVES
            .iter()
            .filter(|&&(leaf, _)| if leaf >= 0x8000_0000 { leaf <= max_ext } else { leaf <= max })
            .map(|&(leaf, sub)| {
                let mut regs = crate::sys::cpu::cpuid(leaf, sub);
                for &(name, l, s, r, bit) in EXTENSIONS {
                    if (l, s) == (leaf, sub) && lacks.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                        regs[r] &= !(1 << bit);
                    }
                }
                CpuidLeaf { leaf, sub, regs }
            })
            .collect();
        CpuRecord { vendor, leaves }
    }

    /// The extensions this record says the CPU has (pure).
    pub fn extensions(&self) -> Vec<&'static str> {
        EXTENSIONS
            .iter()
            .filter(|&&(_, leaf, sub, r, bit)| self.leaves.iter().any(|l| (l.leaf, l.sub) == (leaf, sub) && l.regs[r] & (1 << bit) != 0))
            .map(|e| e.0)
            .collect()
    }
}

/// Refuses a restart on a CPU (`here`) without an extension the checkpoint's CPU (`then`) had,
/// naming them, unless each is in `ignore` (`--ignore-cpu`, any case), which logs them instead
/// (pure but for the log). An image without a record (format 20 and older) is not checked.
pub fn check_extensions(then: Option<&CpuRecord>, here: &CpuRecord, ignore: &[String]) -> Result<()> {
    let Some(then) = then else { return Ok(()) };
    let have = here.extensions();
    let missing: Vec<&str> = then.extensions().into_iter().filter(|e| !have.contains(e)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let (ignored, refused): (Vec<&str>, Vec<&str>) = missing.iter().partition(|m| ignore.iter().any(|i| i.eq_ignore_ascii_case(m)));
    if !ignored.is_empty() {
        tracing::warn!(
            extensions = ignored.join(","),
            "the checkpoint's CPU had these and this one has not; restarting anyway (--ignore-cpu): code chosen for them stops the program with SIGILL"
        );
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(Error::Other(format!(
        "this CPU lacks {} that the checkpoint's CPU ({}) had: libraries chose their code by them when the program started, and it would stop with SIGILL; restart on a CPU with them, or with --ignore-cpu {} to take that risk",
        refused.join(", "),
        if then.vendor.is_empty() { "of unknown vendor" } else { &then.vendor },
        refused.join(",")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_in_use_that_this_cpu_lacks_is_named() {
        let mut buf = vec![0u8; 1024];
        buf[512..520].copy_from_slice(&(0b1110_0111u64).to_le_bytes());
        assert_eq!(components_in_use(&buf), 0b1110_0111);
        // A CPU with x87, SSE and AVX only.
        let lacks = lacking(components_in_use(&buf), 0b111);
        assert_eq!(lacks, ["AVX-512 opmask (bit 5)", "AVX-512 (ZMM_Hi256) (bit 6)", "AVX-512 (Hi16_ZMM) (bit 7)"]);
        assert!(lacking(components_in_use(&buf), 0xff).is_empty());
        assert_eq!(components_in_use(&buf[..100]), 0, "too short to say");
        // This CPU holds what its own threads use.
        let here = crate::sys::cpu::xcr0();
        if let Some(here) = here {
            assert!(here & 0b11 == 0b11, "x87 and SSE are always on: {here:#x}");
        }
    }

    fn cpu(leaf7_ebx: u32) -> CpuRecord {
        CpuRecord {
            vendor: "GenuineIntel".into(),
            leaves: vec![CpuidLeaf { leaf: 1, sub: 0, regs: [0, 0, 1 << 20, 0] }, CpuidLeaf { leaf: 7, sub: 0, regs: [0, leaf7_ebx, 0, 0] }],
        }
    }

    #[test]
    fn extensions_the_checkpoints_cpu_had_and_this_one_lacks_are_named() {
        let then = cpu((1 << 5) | (1 << 16));
        assert_eq!(then.extensions(), ["SSE4.2", "AVX2", "AVX512F"]);
        assert!(check_extensions(Some(&then), &then, &[]).is_ok());
        assert!(check_extensions(None, &cpu(0), &[]).is_ok(), "an image without a record");
        let older = cpu(1 << 5);
        let err = check_extensions(Some(&then), &older, &[]).unwrap_err().to_string();
        assert!(err.contains("this CPU lacks AVX512F") && err.contains("--ignore-cpu AVX512F") && err.contains("GenuineIntel"), "{err}");
        assert!(check_extensions(Some(&then), &older, &["avx512f".into()]).is_ok(), "--ignore-cpu takes the risk");
        assert!(check_extensions(Some(&older), &then, &[]).is_ok(), "a newer CPU");
        // This CPU, as recorded: x86-64 has SSE2 everywhere; the leaves are read.
        let here = CpuRecord::here();
        assert!(!here.vendor.is_empty() && here.leaves.iter().any(|l| l.leaf == 1), "{here:?}");
    }

    /// Intel with AVX-512 keeps MPX's 128 bytes before the opmask (1088); a CPU without MPX puts
    /// it at 832 (AMD Zen 4): each component in use moves to its offset, the others are left
    /// zero, and the kernel's sw_reserved comes from this CPU's own state.
    #[test]
    fn xstate_moves_from_intels_offsets_to_amds() {
        let cpu = |places: &[(u32, u32, u32)]| CpuRecord {
            vendor: "test".into(),
            leaves: places.iter().map(|&(bit, size, at)| CpuidLeaf { leaf: 0xd, sub: bit, regs: [size, at, 0, 0] }).collect(),
        };
        let intel = cpu(&[(2, 256, 576), (3, 64, 960), (4, 64, 1024), (5, 64, 1088), (6, 512, 1152), (7, 1024, 1664)]);
        let amd = cpu(&[(2, 256, 576), (5, 64, 832), (6, 512, 896), (7, 1024, 1408)]);
        let mut saved = vec![0u8; 2688];
        saved[..464].fill(0x11);
        saved[464..512].fill(0x22);
        let in_use: u64 = 0b1110_0111; // x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
        saved[512..520].copy_from_slice(&in_use.to_le_bytes());
        saved[576..832].fill(0xa2);
        saved[1088..1152].fill(0xa5);
        saved[1152..1664].fill(0xa6);
        saved[1664..2688].fill(0xa7);
        let template = {
            let mut t = vec![0u8; 2432];
            t[464..512].fill(0x33);
            t
        };
        assert!(layout_differs(&saved, &intel, &amd));
        assert!(!layout_differs(&saved, &intel, &intel));
        let moved = to_layout(&saved, &intel, &amd, &template).unwrap();
        assert_eq!(moved.len(), 2432);
        assert!(moved[..464].iter().all(|&b| b == 0x11), "legacy area kept");
        assert!(moved[464..512].iter().all(|&b| b == 0x33), "this CPU's sw_reserved");
        assert_eq!(components_in_use(&moved), in_use);
        assert!(moved[576..832].iter().all(|&b| b == 0xa2));
        assert!(moved[832..896].iter().all(|&b| b == 0xa5));
        assert!(moved[896..1408].iter().all(|&b| b == 0xa6));
        assert!(moved[1408..2432].iter().all(|&b| b == 0xa7));
        // A component of another size, or one whose place is not recorded: not moved, named.
        let odd = cpu(&[(2, 256, 576), (5, 32, 832), (6, 512, 896), (7, 1024, 1408)]);
        assert!(to_layout(&saved, &intel, &odd, &template).unwrap_err().contains("opmask"));
        assert!(to_layout(&saved, &CpuRecord::default(), &amd, &template).unwrap_err().contains("not known"));
        assert!(!layout_differs(&saved, &CpuRecord::default(), &amd), "an image without the leaves is not moved");
    }
}
