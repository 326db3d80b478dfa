use std::io::Write;

use transfer_service::config::{Cli, Command};
use transfer_service::{app, http, telemetry};

/// The allocator: jemalloc, which cost a quarter less CPU a transfer than glibc's malloc under
/// load (docs/operations.md, "Memory").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings (`narenas:1`, pages back to the kernel within a second, purged on its
/// own thread), read before an operator's `_RJEM_MALLOC_CONF` (docs/operations.md, "Memory").
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
    let traces = match command {
        Command::Openapi => None,
        _ => telemetry::init(cli.config.log_format),
    };
    let code = match command {
        Command::Serve => app::serve(cli.config).await,
        Command::Audit => app::audit(cli.config).await,
        Command::Shards { to, dry_run } => app::grow_shards(cli.config, to, dry_run).await,
        Command::Openapi => print_openapi(),
    };
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    code
}

/// `transfer-service openapi > openapi/openapi.json`. A reader that closes the pipe early
/// (`| head`) has what it wanted: that ends the command quietly.
fn print_openapi() -> std::process::ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(http::openapi::document_json().as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("cannot write the OpenAPI document: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
