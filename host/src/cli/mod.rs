//! The command line: `wasm-provisioner run` (the controller), `wasm-provisioner guest
//! provision|delete|validate|capacity|expand` (the offline runner of one plugin call)
//! and `wasm-provisioner guest new` (a new guest project). Every flag has an
//! environment variable (`WASM_PROVISIONER_...`) and a named default.

pub mod args;
pub mod guest;
pub mod guest_new;
pub mod run;

use std::process::ExitCode;

use clap::Parser;

use std::path::PathBuf;

pub use args::{Cli, Command, DEFAULT_LOG_FILTER, GuestArgs, GuestCommand};

/// Parses the command line, runs it, and turns the outcome into an exit code. Errors
/// go to stderr, with a non-zero exit.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The compile child: no logging, no async runtime, its limits first.
    if let Command::CompileModule(args) = &cli.command {
        return wasm_provisioner_runtime::compile::child_main(args);
    }
    init_logging(&cli.log, cli.log_format == "json");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Spawned, not run on this thread by `block_on`: the work (the controllers' streams,
    // every reconcile) then runs on the runtime's workers, next to the connections it
    // waits on, instead of waking this thread across threads for every response (a
    // tenth of the host's CPU in a storm went to those wake-ups).
    let outcome = runtime.block_on(async { tokio::spawn(run(cli)).await });
    match outcome {
        Ok(Ok(code)) => code,
        Ok(Err(error)) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
        Err(failed) => {
            eprintln!("error: {failed}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command line; the exit code of a success is 0, except for a `guest
/// delete` still going on in the background
/// ([`EXIT_DELETE_IN_BACKGROUND`](guest::EXIT_DELETE_IN_BACKGROUND)).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(&args.plugins, &args.sources, &args.controller)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Guest(GuestArgs {
            command: GuestCommand::Provision(args),
        }) => {
            let pv = guest::provision(&args).await?;
            print!("{pv}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Guest(GuestArgs {
            command: GuestCommand::Delete(args),
        }) => match guest::delete(&args).await? {
            guest::DeleteOutcome::Deleted(summary) => {
                println!("{summary}");
                Ok(ExitCode::SUCCESS)
            }
            guest::DeleteOutcome::InBackground(summary) => {
                println!("{summary}");
                Ok(ExitCode::from(guest::EXIT_DELETE_IN_BACKGROUND))
            }
        },
        Command::Guest(GuestArgs {
            command: GuestCommand::Validate(args),
        }) => {
            println!("{}", guest::validate(&args).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Guest(GuestArgs {
            command: GuestCommand::Capacity(args),
        }) => {
            print!("{}", guest::capacity(&args).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Guest(GuestArgs {
            command: GuestCommand::Expand(args),
        }) => {
            print!("{}", guest::expand(&args).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::CompileModule(args) => Ok(wasm_provisioner_runtime::compile::child_main(&args)),
        Command::Guest(GuestArgs {
            command: GuestCommand::New(args),
        }) => {
            let dir = args
                .dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(&args.name));
            let created = guest_new::create(&args.name, args.lang, &dir, args.sdk_path.as_deref())?;
            println!(
                "created the {:?} guest {} in {} ({} files): cd {} && bash test.sh",
                args.lang,
                args.name,
                created.dir.display(),
                created.files.len(),
                created.dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Logs to stderr (stdout carries the `guest` commands' output).
fn init_logging(filter: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colours only on a terminal: escape sequences in a log file or a pod's log are
    // noise, and without them a raw ESC in the log is always a bug.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
