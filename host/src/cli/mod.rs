//! The command line: `wasm-provisioner run` (the controller), `wasm-provisioner guest
//! provision|delete` (the offline runner of one plugin call) and `wasm-provisioner guest
//! new` (a new guest project). Every flag has an
//! environment variable (`WASM_PROVISIONER_...`) and a named default.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::names;

/// Default modules directory (where the modules ConfigMap or volume is mounted).
pub const DEFAULT_MODULES_DIR: &str = "/etc/wasm-provisioner/modules";
/// Default log filter (tracing `EnvFilter` syntax).
pub const DEFAULT_LOG_FILTER: &str = "info";

#[derive(Debug, Parser)]
#[command(
    name = "wasm-provisioner",
    version,
    about = "Kubernetes volume provisioner with WebAssembly plugins"
)]
pub struct Cli {
    /// Log filter, such as `info` or `wasm_provisioner=debug,guest=trace`.
    #[arg(long, global = true, env = "WASM_PROVISIONER_LOG", default_value = DEFAULT_LOG_FILTER)]
    pub log: String,

    /// Log format: plain or json.
    #[arg(long, global = true, env = "WASM_PROVISIONER_LOG_FORMAT", default_value = "plain", value_parser = ["plain", "json"])]
    pub log_format: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the provisioner controller against the cluster.
    Run(RunArgs),
    /// Run one plugin call offline, without a cluster: see what a module would do.
    Guest(GuestArgs),
    /// Internal: compile one module read from stdin, bounded, and write the compiled
    /// component to stdout. The host runs itself with it; never run it by hand.
    #[command(name = crate::plugin::compile::SUBCOMMAND, hide = true)]
    CompileModule(crate::plugin::compile::CompileChildArgs),
}

/// Where plugins come from and what they may touch: shared by `run` and `guest`.
#[derive(Debug, Clone, Args)]
pub struct PluginArgs {
    /// Directory of plugin modules: module NAME is the file NAME.wasm.
    #[arg(long, env = "WASM_PROVISIONER_MODULES", default_value = DEFAULT_MODULES_DIR)]
    pub modules: PathBuf,

    /// Grants file (YAML): directories, outbound HTTP and limits per module. Without
    /// it, modules get no capabilities and the default limits.
    #[arg(long, env = "WASM_PROVISIONER_GRANTS")]
    pub grants: Option<PathBuf>,

    /// Directory for precompiled modules, writable by this process only. Without it,
    /// modules are compiled at every start.
    #[arg(long, env = "WASM_PROVISIONER_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Bytes of log (the `log` import, stdout and stderr together) one plugin call may
    /// write; the rest is dropped, counted, and reported once at the end of the call.
    #[arg(long, env = "WASM_PROVISIONER_GUEST_LOG_BYTES_PER_CALL", default_value_t = crate::plugin::limits::DEFAULT_GUEST_LOG_BYTES_PER_CALL)]
    pub guest_log_bytes_per_call: usize,

    /// Largest module file read, in bytes: a larger one (or one that turns out larger
    /// while it is read) is refused like a broken version.
    #[arg(long, env = "WASM_PROVISIONER_MAX_MODULE_BYTES", default_value_t = crate::plugin::DEFAULT_MAX_MODULE_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_module_bytes: u64,

    /// Guest instances alive at once, every module together: the size of the pool
    /// each call's instance comes from (and 4 linear memories and 4 tables per
    /// instance). Each module reserves its share at load, what one call defines times
    /// its maxConcurrentCalls; a module version that does not fit beside the others is
    /// refused at load. 0: no pool, the on-demand allocator (each call maps its memory
    /// afresh, nothing to share), as when the pool's address space cannot be reserved.
    #[arg(long, env = "WASM_PROVISIONER_MAX_GUEST_INSTANCES", default_value_t = crate::plugin::engine::DEFAULT_MAX_GUEST_INSTANCES, value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub max_guest_instances: u32,

    /// Longest one module's compile may take (wall clock). Each module missing from
    /// the cache is compiled in a child process, killed at this timeout; the version is
    /// then refused until its bytes change or the host restarts.
    #[arg(long, env = "WASM_PROVISIONER_COMPILE_TIMEOUT", default_value = DEFAULT_COMPILE_TIMEOUT, value_parser = positive_duration)]
    pub compile_timeout: std::time::Duration,

    /// Most memory one module's compile may use, in bytes (the compile child's
    /// RLIMIT_DATA); a compile needing more is stopped and the version refused.
    #[arg(long, env = "WASM_PROVISIONER_COMPILE_MEMORY_BYTES", default_value_t = crate::plugin::compile::DEFAULT_COMPILE_MEMORY_BYTES, value_parser = clap::value_parser!(u64).range(MIN_COMPILE_MEMORY_BYTES..))]
    pub compile_memory_bytes: u64,
}

/// Default of `--compile-timeout` ([`DEFAULT_COMPILE_TIMEOUT`](crate::plugin::compile::DEFAULT_COMPILE_TIMEOUT)).
pub const DEFAULT_COMPILE_TIMEOUT: &str = "120s";
/// Least `--compile-memory-bytes`: below it not even the compile child's engine starts.
pub const MIN_COMPILE_MEMORY_BYTES: u64 = 32 << 20;

fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err("must be more than 0s".into()),
        Err(error) => Err(error.to_string()),
    }
}

impl PluginArgs {
    /// How `run` and the offline runner compile: in a child process of this binary,
    /// bounded by `--compile-timeout` and `--compile-memory-bytes`.
    pub fn compiler(&self) -> crate::plugin::CompilerConfig {
        crate::plugin::CompilerConfig::this_binary(self.compile_timeout, self.compile_memory_bytes)
    }
}

/// Arguments of `run` (the controller).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    #[command(flatten)]
    pub controller: crate::run::ControllerArgs,
}

#[derive(Debug, Args)]
pub struct GuestArgs {
    #[command(subcommand)]
    pub command: GuestCommand,
}

#[derive(Debug, Subcommand)]
pub enum GuestCommand {
    /// Provision a claim with a module and print the PersistentVolume (YAML) the
    /// controller would create. The backend work really happens (inside the grants).
    Provision(GuestProvisionArgs),
    /// Delete the backend volume of a PersistentVolume with a module.
    Delete(GuestDeleteArgs),
    /// Create a new guest project (Rust, Python or JavaScript) outside this repository:
    /// the WIT at this host's version, a plugin, build.sh, test.sh and a README.
    New(GuestNewArgs),
}

#[derive(Debug, Clone, Args)]
pub struct GuestNewArgs {
    /// The module name (a DNS label): the project, the crate or package, and the
    /// module file `NAME.wasm` are named after it.
    pub name: String,

    /// The language of the guest.
    #[arg(long, env = "WASM_PROVISIONER_GUEST_LANG", value_enum)]
    pub lang: crate::guest_new::Lang,

    /// The directory to create (it must not exist, or be empty); default `./NAME`.
    #[arg(long, env = "WASM_PROVISIONER_GUEST_DIR")]
    pub dir: Option<PathBuf>,

    /// Rust only: depend on the SDK crate at this path (a clone's `guests/sdk`) instead
    /// of the git tag of this host's version.
    #[arg(long, env = "WASM_PROVISIONER_SDK_PATH")]
    pub sdk_path: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct GuestProvisionArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// StorageClass YAML file.
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: PathBuf,

    /// PersistentVolumeClaim YAML file.
    #[arg(long, env = "WASM_PROVISIONER_CLAIM")]
    pub claim: PathBuf,

    /// Node YAML file: the node selected for a WaitForFirstConsumer claim.
    #[arg(long, env = "WASM_PROVISIONER_NODE")]
    pub node: Option<PathBuf>,

    /// Provisioner name recorded on the PV (`pv.kubernetes.io/provisioned-by`).
    #[arg(long, env = "WASM_PROVISIONER_PROVISIONER_NAME", default_value = names::DEFAULT_PROVISIONER_NAME)]
    pub provisioner_name: String,
}

#[derive(Debug, Clone, Args)]
pub struct GuestDeleteArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The module to call; defaults to the class's `module` parameter, then to the
    /// PV's `wasm-provisioner.dev/module` annotation.
    #[arg(long, env = "WASM_PROVISIONER_MODULE")]
    pub module: Option<String>,

    /// PersistentVolume YAML file.
    #[arg(long, env = "WASM_PROVISIONER_VOLUME")]
    pub volume: PathBuf,

    /// StorageClass YAML file (its parameters go to the plugin).
    #[arg(long, env = "WASM_PROVISIONER_CLASS")]
    pub class: Option<PathBuf>,
}

/// Parses the command line, runs it, and turns the outcome into an exit code. Errors
/// go to stderr, with a non-zero exit.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The compile child: no logging, no async runtime, its limits first.
    if let Command::CompileModule(args) = &cli.command {
        return crate::plugin::compile::child_main(args);
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
/// ([`EXIT_DELETE_IN_BACKGROUND`](crate::guest_cli::EXIT_DELETE_IN_BACKGROUND)).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => crate::run::run(&args.plugins, &args.controller)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Guest(GuestArgs {
            command: GuestCommand::Provision(args),
        }) => {
            let pv = crate::guest_cli::provision(&args).await?;
            print!("{pv}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Guest(GuestArgs {
            command: GuestCommand::Delete(args),
        }) => match crate::guest_cli::delete(&args).await? {
            crate::guest_cli::DeleteOutcome::Deleted(summary) => {
                println!("{summary}");
                Ok(ExitCode::SUCCESS)
            }
            crate::guest_cli::DeleteOutcome::InBackground(summary) => {
                println!("{summary}");
                Ok(ExitCode::from(crate::guest_cli::EXIT_DELETE_IN_BACKGROUND))
            }
        },
        Command::CompileModule(args) => Ok(crate::plugin::compile::child_main(&args)),
        Command::Guest(GuestArgs {
            command: GuestCommand::New(args),
        }) => {
            let dir = args
                .dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(&args.name));
            let created =
                crate::guest_new::create(&args.name, args.lang, &dir, args.sdk_path.as_deref())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        fn walk(command: &clap::Command, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if arg.get_long().is_some() && !builtin && arg.get_env().is_none() {
                    missing.push(format!(
                        "{} --{}",
                        command.get_name(),
                        arg.get_long().unwrap()
                    ));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), &mut missing);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
    }

    #[test]
    fn guest_provision_parses() {
        let cli = Cli::try_parse_from([
            "wasm-provisioner",
            "guest",
            "provision",
            "--modules",
            "/m",
            "--module",
            "hostpath",
            "--class",
            "sc.yaml",
            "--claim",
            "pvc.yaml",
        ])
        .unwrap();
        let Command::Guest(GuestArgs {
            command: GuestCommand::Provision(args),
        }) = cli.command
        else {
            panic!("not guest provision");
        };
        assert_eq!(args.module.as_deref(), Some("hostpath"));
        assert_eq!(args.provisioner_name, names::DEFAULT_PROVISIONER_NAME);
        assert!(args.plugins.grants.is_none());
        assert_eq!(args.plugins.max_module_bytes, 64 * 1024 * 1024);
    }

    #[test]
    fn max_module_bytes_is_a_positive_byte_count_for_run_and_guest() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let plugins = |cli: Cli| match cli.command {
            Command::Run(args) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Provision(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::Delete(args),
            }) => args.plugins,
            Command::Guest(GuestArgs {
                command: GuestCommand::New(_),
            })
            | Command::CompileModule(_) => unreachable!("no plugin arguments"),
        };
        let cli = parse(&["wasm-provisioner", "run", "--max-module-bytes", "1048576"]).unwrap();
        assert_eq!(plugins(cli).max_module_bytes, 1 << 20);
        let cli = parse(&[
            "wasm-provisioner",
            "guest",
            "delete",
            "--volume",
            "pv.yaml",
            "--max-module-bytes=4096",
        ])
        .unwrap();
        assert_eq!(plugins(cli).max_module_bytes, 4096);
        assert!(parse(&["wasm-provisioner", "run", "--max-module-bytes", "0"]).is_err());
        assert!(parse(&["wasm-provisioner", "run", "--max-module-bytes", "64MiB"]).is_err());
    }

    #[test]
    fn compile_limits_are_flags_of_run_and_guest_with_defaults() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let Command::Run(args) = parse(&["wasm-provisioner", "run"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(
            args.plugins.compile_timeout,
            crate::plugin::compile::DEFAULT_COMPILE_TIMEOUT
        );
        assert_eq!(
            args.plugins.compile_memory_bytes,
            crate::plugin::compile::DEFAULT_COMPILE_MEMORY_BYTES
        );
        let Command::Run(args) = parse(&[
            "wasm-provisioner",
            "run",
            "--compile-timeout=3s",
            "--compile-memory-bytes=268435456",
        ])
        .unwrap()
        .command
        else {
            panic!("not run");
        };
        assert_eq!(
            args.plugins.compile_timeout,
            std::time::Duration::from_secs(3)
        );
        assert_eq!(args.plugins.compile_memory_bytes, 256 << 20);
        assert!(parse(&["wasm-provisioner", "run", "--compile-timeout=0s"]).is_err());
        assert!(parse(&["wasm-provisioner", "run", "--compile-memory-bytes=1024"]).is_err());
        let Command::Guest(GuestArgs {
            command: GuestCommand::Provision(args),
        }) = parse(&[
            "wasm-provisioner",
            "guest",
            "provision",
            "--class=c",
            "--claim=p",
            "--compile-timeout=1m",
        ])
        .unwrap()
        .command
        else {
            panic!("not guest provision");
        };
        assert_eq!(
            args.plugins.compile_timeout,
            std::time::Duration::from_secs(60)
        );
    }
}
