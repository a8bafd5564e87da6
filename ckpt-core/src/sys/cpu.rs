//! What this CPU offers, from the instructions that tell (XGETBV), for checks that compare it
//! with the CPU a checkpoint was taken on (`objects::xstate`).

/// XCR0: the XSAVE components the kernel enabled on this CPU; `None` on a CPU without XSAVE.
/// Without the components the test hook names ([`test_lacks_names`]).
pub fn xcr0() -> Option<u64> {
    if !std::is_x86_feature_detected!("xsave") {
        return None;
    }
    // SAFETY: XGETBV with ECX 0 reads XCR0; the CPU has XSAVE (checked above), so the
    // instruction exists, and the OS enabled it (OSXSAVE, which the detection requires).
    let here = unsafe { xgetbv0() };
    Some(here & !test_lacks())
}

/// The names the test hook `CKPT_TEST_CPU_LACKS` lists, comma-separated: components (`sse`,
/// `avx`, `avx512`, `amx`) or extensions to take as missing from this CPU (a restart "on an
/// older CPU" without one).
pub fn test_lacks_names() -> Vec<String> {
    crate::testhooks::var("CKPT_TEST_CPU_LACKS").map(|v| v.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect()).unwrap_or_default()
}

/// CPUID of `leaf`, `sub`: eax, ebx, ecx, edx.
pub fn cpuid(leaf: u32, sub: u32) -> [u32; 4] {
    // SAFETY: CPUID exists on every x86_64 CPU and only reads.
    #[allow(unused_unsafe)]
    let r = unsafe { std::arch::x86_64::__cpuid_count(leaf, sub) };
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// The highest basic leaf and the vendor string (leaf 0: ebx, edx, ecx).
pub fn vendor() -> (u32, String) {
    let [max, b, c, d] = cpuid(0, 0);
    let bytes: Vec<u8> = [b, d, c].iter().flat_map(|r| r.to_le_bytes()).collect();
    (max, String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string())
}

/// The components the test hook takes away (pure but for the environment).
fn test_lacks() -> u64 {
    test_lacks_names()
        .iter()
        .map(|n| match n.as_str() {
            "sse" => 1 << 1,
            "avx" => 1 << 2,
            "avx512" => 0b111 << 5,
            "amx" => 0b11 << 17,
            _ => 0,
        })
        .fold(0, |a, b| a | b)
}

#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}
