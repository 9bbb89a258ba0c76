use cairn_common::config::{exit_invalid, parse_or_exit};
use cairn_reaper::Config;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let config: Config = parse_or_exit();
    if let Err(reason) = config.validate() {
        exit_invalid(reason);
    }
    let log_format = config.log.log_format;
    cairn_common::component::main("reaper", config, log_format, cairn_reaper::run).await
}
