use cairn_common::config::{exit_invalid, parse_or_exit};
use cairn_common::{shutdown, telemetry};
use cairn_scheduler::Config;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let config: Config = parse_or_exit();
    if config.print_openapi {
        println!("{}", cairn_scheduler::api::openapi::json());
        return ExitCode::SUCCESS;
    }
    if let Err(reason) = config.validate() {
        exit_invalid(reason);
    }
    telemetry::init(config.log.log_format);
    let shutdown = match shutdown::on_signal() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cairn_scheduler::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "scheduler failed");
            ExitCode::FAILURE
        }
    }
}
