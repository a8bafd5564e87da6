//! Hooks for the end-to-end tests: environment variables (`CKPT_TEST_*`) that make a build
//! behave as it would on another machine (another boot, an older CPU, another kernel's vdso, a
//! GPU driver's stand-in) or die at a chosen step of a checkpoint.
//!
//! They exist only in a build with the `test-hooks` feature (the tests' build: scripts/test.sh
//! builds the binary it tests so). In any other build, the binary users run, [`var`] is
//! always `None` and neither the hooks' code nor their names are in the binary: no
//! environment can make a user's ckpt pretend, whoever starts it.

/// The value of the test hook `name` where the tests set it; `None` when unset, or always in a
/// build without the `test-hooks` feature.
#[cfg(feature = "test-hooks")]
pub fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok()
}

/// The value of the test hook `name`: never, in a build without the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn var(_name: &'static str) -> Option<String> {
    None
}

/// Whether this build has the test hooks (`ckpt --version` says so, and the end-to-end tests
/// refuse a binary without them).
pub const BUILT_IN: bool = cfg!(feature = "test-hooks");

#[cfg(test)]
mod tests {
    #[test]
    fn a_hook_reads_the_environment_only_in_a_build_with_the_feature() {
        // The unit tests are built with the feature where the workspace's tests crate is
        // built beside them (it turns the feature on), and without it alone (`-p ckpt-core`).
        // PATH is set wherever tests run (setting a variable here would race other tests).
        assert!(std::env::var_os("PATH").is_some());
        assert_eq!(super::var("PATH").is_some(), super::BUILT_IN);
    }
}
