//! Process-wide allocator setting: caps glibc's malloc arenas at the number of CPUs.
//!
//! Where it sits: called once by `main` (and the benchmarks) before the async runtime starts.
//! Why: glibc gives each thread that allocates under contention its own arena, up to 8 per core,
//! and an arena keeps memory freed into it for reuse by that arena only. cdcd allocates on the
//! runtime's workers and on `spawn_blocking` threads (Parquet encoding, the LSM compactor), so
//! the buffers of one commit or compaction are freed into one arena and the next ones are
//! allocated in another: measured with `examples/sink_bench.rs --sinks lsm` (issue 9), peak RSS
//! was 234 MiB with the default arenas, 156 MiB with `MALLOC_ARENA_MAX=2` and 117 MiB with 1,
//! for a heap whose own peak (valgrind massif) is far below either. An explicit
//! `MALLOC_ARENA_MAX` in the environment still wins: this only sets the default.

/// Limits glibc malloc to one arena per CPU unless `MALLOC_ARENA_MAX` is set. A no-op on other
/// C libraries.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return;
        }
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let arenas = i32::try_from(cpus).unwrap_or(i32::MAX);
        // glibc's `M_ARENA_MAX` (malloc.h).
        const M_ARENA_MAX: i32 = -8;
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: `mallopt` only records a tuning value; glibc documents it as callable at any
        // time, and it is called before the runtime's threads exist.
        #[allow(unsafe_code)]
        unsafe {
            mallopt(M_ARENA_MAX, arenas);
        }
    }
}
