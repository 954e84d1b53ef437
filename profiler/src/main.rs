use clap::Parser as _;
use profiler::{cli::Cli, error::UserError};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    let code = match profiler::run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            let code = err
                .downcast_ref::<UserError>()
                .map_or(profiler::error::exit::FAILURE, UserError::exit_code);
            eprintln!("bpfprof: {err:#}");
            code
        }
    };
    std::process::exit(code);
}
