fn main() -> std::process::ExitCode {
    let config: cairn_worker::config::Config = cairn_common::component::settings();
    // Before any thread: a mount namespace is the whole process's only then.
    if let Err(e) = cairn_worker::disk::private_mounts(config.disk_quota) {
        eprintln!("cairn-worker: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cairn-worker: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(cairn_common::component::main(
        "worker",
        config,
        cairn_worker::run,
    ))
}
