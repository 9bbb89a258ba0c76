#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = cairn_common::component::settings();
    cairn_common::component::main("reaper", config, cairn_reaper::run).await
}
