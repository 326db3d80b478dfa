use clap::Parser;
use transfer_service::config::{Cli, Command};
use transfer_service::{app, audit, telemetry};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.config.log_format);
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => app::serve(cli.config).await,
        Command::Audit => audit::run(cli.config).await,
    }
}
