use cairn_common::config::{exit_invalid, parse_or_exit};
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
    let log_format = config.log.log_format;
    cairn_common::component::main("scheduler", config, log_format, cairn_scheduler::run).await
}
