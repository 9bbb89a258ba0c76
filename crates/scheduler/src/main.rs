use cairn_common::component;
use cairn_common::config::parse_or_exit;
use cairn_scheduler::Config;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let config: Config = parse_or_exit();
    if config.print_openapi {
        println!("{}", cairn_scheduler::api::openapi::json());
        return ExitCode::SUCCESS;
    }
    component::main(
        "scheduler",
        component::validated(config),
        cairn_scheduler::run,
    )
    .await
}
