use std::io::Write;

use clap::Parser;
use transfer_service::config::{Cli, Command};
use transfer_service::{app, audit, http, telemetry};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let command = cli.command.clone().unwrap_or(Command::Serve);
    // `openapi` prints the document on stdout, where nothing else may write.
    if !matches!(command, Command::Openapi) {
        telemetry::init(cli.config.log_format);
    }
    match command {
        Command::Serve => app::serve(cli.config).await,
        Command::Audit => audit::run(cli.config).await,
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
