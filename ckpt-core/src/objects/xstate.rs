//! The extended register state (XSAVE area) of threads, across CPUs (issue 35, §2).
//!
//! A thread's `XState` is the kernel's NT_X86_XSTATE buffer: the legacy 512 bytes (x87, SSE),
//! then the XSAVE header, whose first 8 bytes (XSTATE_BV, at 512) say which components hold
//! state, then each component at this CPU's offset. A restart on a CPU without a component the
//! thread uses would lose registers the program relies on (and libraries picked their code by
//! the CPU at start: the program would stop with SIGILL), so it is refused first, naming the
//! component, before any process exists ([`check`]). A CPU with the same components but another
//! layout (another buffer size) is refused when the state is put back, saying so
//! ([`size_refused`]); converting between layouts is the plan's next step
//! (docs/PLAN-ANOTHER-MACHINE.md, §2).

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
pub fn check(processes: &[ProcessRecord], here: Option<u64>) -> Result<()> {
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
pub fn size_refused(tid: i32, saved: usize, here: usize) -> Error {
    Error::Other(format!(
        "thread {tid}: the checkpoint's CPU saved {saved} bytes of extended register state (XSAVE) and this one takes {here}: its layout differs (another CPU model); restart on a CPU of the same model (converting the layout is not done yet)"
    ))
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
}
