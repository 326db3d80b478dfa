use std::io::Write;

use transfer_service::config::{Cli, Command};
use transfer_service::{app, http, telemetry};

/// The allocator: jemalloc instead of glibc's malloc. A transfer allocates and frees many
/// blocks on different threads (hyper's 8 KiB read buffers, redb's 4 KiB pages), where glibc
/// spent a fifth of the service's CPU. The benchmark measured about 25% less CPU per transfer
/// under 2,000 connections and 8% less at 64 clients. Peak RSS grew by some 20 MiB (49 → 60
/// MiB at 64 clients); under 2,000 connections the smaller default page cache
/// (`EMBEDDED_CACHE_MIB`) gives it back (docs/benchmark.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its first allocation (an operator's `_RJEM_MALLOC_CONF`
/// environment variable is read after them and wins; jemalloc's plain `MALLOC_CONF` is not
/// read by this build):
/// - `narenas:1`: one arena, not jemalloc's four per core (it counts the cores the process
///   may run on, not a container's CPU quota). Memory one thread frees is reused by every
///   thread: the committer's turns and reads move between tokio's blocking threads, and with
///   two arenas peak RSS under 2,000 connections was bimodal, 163–170 MiB in most runs and
///   187–193 MiB when a second blocking thread joined; with one, 158–161 MiB in 8 runs of 8.
///   No CPU cost measured (the threads' caches take most allocations without the arena's
///   lock): per transfer, median of 3 pairs, 0.85 of two arenas in batches, 0.89 at 64 clients;
/// - `dirty_decay_ms:1000`, `muzzy_decay_ms:0`: freed pages go back to the kernel within
///   about a second (the default keeps them ten), so a burst leaves no lasting RSS;
/// - `background_thread:true` (Linux with glibc only: jemalloc has no background threads on
///   macOS, where asking for them fails its start, nor working ones with musl): that purging
///   happens on jemalloc's own thread, not in the middle of a request's free.
#[cfg(not(target_env = "msvc"))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
static malloc_conf: Option<&'static std::ffi::c_char> = Some(
    // SAFETY: a pointer to the first byte of a static NUL-terminated string, which is what
    // jemalloc reads through `malloc_conf`.
    unsafe { &*JEMALLOC_SETTINGS.as_ptr() },
);

#[cfg(all(target_os = "linux", target_env = "gnu"))]
const JEMALLOC_SETTINGS: &std::ffi::CStr =
    c"narenas:1,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
const JEMALLOC_SETTINGS: &std::ffi::CStr = c"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0";

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("cannot start the async runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> std::process::ExitCode {
    let cli = Cli::parse_args();
    let command = cli.command.clone().unwrap_or(Command::Serve);
    // `openapi` prints the document on stdout, where nothing else may write.
    if !matches!(command, Command::Openapi) {
        telemetry::init(cli.config.log_format);
    }
    match command {
        Command::Serve => app::serve(cli.config).await,
        Command::Audit => app::audit(cli.config).await,
        Command::Openapi => print_openapi(),
    }
}

/// `transfer-service openapi > openapi/openapi.json`
fn print_openapi() -> std::process::ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(http::openapi::document_json().as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cannot write the OpenAPI document: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
