//! Returning freed host memory to the operating system.

/// Hands the C heap's free pages back to the operating system (glibc's `malloc_trim`), after a
/// phase that freed many mid-sized blocks: host tensors under glibc's mmap threshold (at most
/// 32 MiB) go back to the heap's free lists when dropped, not to the system, so a model whose
/// host weights were freed as they were uploaded would otherwise keep their pages resident
/// while the device copies take new ones. A no-op on other C libraries.
pub(crate) fn trim_host_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::os::raw::c_int;
        }
        // SAFETY: malloc_trim takes no pointers and may be called at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}
