//! The NVIDIA driver's checkpoint API (CUDA 12.8 and later, driver r570 and later), loaded at
//! run time from `libcuda.so.1` (found as the dynamic loader finds any library: its cache,
//! `LD_LIBRARY_PATH`). ckpt has no build-time CUDA dependency: on a machine without the driver,
//! [`CudaLibrary::load`] says so and nothing else changes.
//!
//! Only the calls ckpt makes are bound; the decisions (which processes, in which order, what a
//! failure means) are `crate::gpu`'s.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// A `CUresult` other than `CUDA_SUCCESS`, with the names the driver gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    pub code: i32,
    /// `CUDA_ERROR_...`, when the driver knows the code.
    pub name: String,
    /// The driver's sentence for it.
    pub text: String,
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.name.is_empty(), self.text.is_empty()) {
            (false, false) => write!(f, "{} ({}): {}", self.name, self.code, self.text),
            (false, true) => write!(f, "{} ({})", self.name, self.code),
            _ => write!(f, "CUDA error {}", self.code),
        }
    }
}

type CuResult = c_int;
type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
type DriverGetVersionFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type ErrorTextFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type GetStateFn = unsafe extern "C" fn(c_int, *mut c_int) -> CuResult;
type LockFn = unsafe extern "C" fn(c_int, *mut LockArgs) -> CuResult;
/// Checkpoint, restore and unlock: their argument structs are optional; ckpt passes none.
type ActionFn = unsafe extern "C" fn(c_int, *mut c_void) -> CuResult;

/// `CUcheckpointLockArgs`: 64 bytes, everything but the timeout reserved and zero.
#[repr(C)]
#[derive(Default)]
struct LockArgs {
    timeout_ms: c_uint,
    reserved0: c_uint,
    reserved1: [u64; 7],
}

/// The loaded library and the entry points ckpt calls.
pub struct CudaLibrary {
    // Kept loaded for as long as the function pointers below are.
    _lib: libloading::Library,
    init: InitFn,
    driver_get_version: DriverGetVersionFn,
    get_error_name: ErrorTextFn,
    get_error_string: ErrorTextFn,
    get_state: GetStateFn,
    lock: LockFn,
    checkpoint: ActionFn,
    restore: ActionFn,
    unlock: ActionFn,
}

/// Why the driver's checkpoint API is not at hand.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error("no NVIDIA driver library (libcuda.so.1) could be loaded: {0}")]
    NoLibrary(String),
    #[error("the NVIDIA driver here has no checkpoint API ({symbol} is missing from libcuda.so.1; it needs driver r570 or later, CUDA 12.8)")]
    NoCheckpointApi { symbol: &'static str },
}

impl CudaLibrary {
    pub fn load() -> Result<CudaLibrary, LoadError> {
        // SAFETY: loading runs the library's initialisers; libcuda's are the driver's own and
        // make no assumption about the program that loads it.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| LoadError::NoLibrary(e.to_string()))?;
        macro_rules! entry {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the type is the one cuda.h declares for this name.
                let symbol: Result<libloading::Symbol<$ty>, _> = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                *symbol.map_err(|_| LoadError::NoCheckpointApi { symbol: $name })?
            }};
        }
        let init = entry!("cuInit", InitFn);
        let driver_get_version = entry!("cuDriverGetVersion", DriverGetVersionFn);
        let get_error_name = entry!("cuGetErrorName", ErrorTextFn);
        let get_error_string = entry!("cuGetErrorString", ErrorTextFn);
        let get_state = entry!("cuCheckpointProcessGetState", GetStateFn);
        let lock = entry!("cuCheckpointProcessLock", LockFn);
        let checkpoint = entry!("cuCheckpointProcessCheckpoint", ActionFn);
        let restore = entry!("cuCheckpointProcessRestore", ActionFn);
        let unlock = entry!("cuCheckpointProcessUnlock", ActionFn);
        Ok(CudaLibrary { _lib: lib, init, driver_get_version, get_error_name, get_error_string, get_state, lock, checkpoint, restore, unlock })
    }

    fn check(&self, r: CuResult) -> Result<(), CudaError> {
        if r == 0 {
            return Ok(());
        }
        let text_of = |f: ErrorTextFn| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: the driver sets `p` to a static string, or leaves it null for an unknown code.
            if unsafe { f(r, &mut p) } != 0 || p.is_null() {
                return String::new();
            }
            // SAFETY: a non-null answer is a NUL-terminated string the driver owns for good.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(CudaError { code: r, name: text_of(self.get_error_name), text: text_of(self.get_error_string) })
    }

    /// `cuInit(0)`: the driver's restore needs it in the caller (or persistence mode).
    pub fn init(&self) -> Result<(), CudaError> {
        // SAFETY: plain value argument.
        self.check(unsafe { (self.init)(0) })
    }

    /// The driver's version, as `cuDriverGetVersion` encodes it (1000 × major + 10 × minor).
    pub fn driver_version(&self) -> Result<i32, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        self.check(unsafe { (self.driver_get_version)(&mut v) })?;
        Ok(v)
    }

    /// `CUprocessState` of `pid` (0 running, 1 locked, 2 checkpointed, 3 failed, ...).
    pub fn process_state(&self, pid: i32) -> Result<i32, CudaError> {
        let mut state: c_int = -1;
        // SAFETY: writes one enum (int-sized).
        self.check(unsafe { (self.get_state)(pid, &mut state) })?;
        Ok(state)
    }

    /// `cuCheckpointProcessLock`, waiting at most `timeout_ms` (0: no limit).
    pub fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), CudaError> {
        let mut args = LockArgs { timeout_ms, ..Default::default() };
        // SAFETY: `args` is the 64-byte struct the call reads.
        self.check(unsafe { (self.lock)(pid, &mut args) })
    }

    pub fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        // SAFETY: the arguments are optional (null: none).
        self.check(unsafe { (self.checkpoint)(pid, std::ptr::null_mut()) })
    }

    pub fn restore(&self, pid: i32) -> Result<(), CudaError> {
        // SAFETY: as `checkpoint`.
        self.check(unsafe { (self.restore)(pid, std::ptr::null_mut()) })
    }

    pub fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        // SAFETY: as `checkpoint`.
        self.check(unsafe { (self.unlock)(pid, std::ptr::null_mut()) })
    }
}
