#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = cairn_common::component::settings();
    cairn_common::component::main("worker", config, cairn_worker::run).await
}
