//! The `conclave` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use conclave::config::{Config, Overrides, SandboxBackendKind};
use conclave::server::{Server, Tools};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "conclave",
    version,
    about = "Streaming agent server with sandbox isolation"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on (default 127.0.0.1:8080).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Directory of the store (default ./data).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Where tool calls run (default auto: docker when its socket
        /// answers, else local namespaces).
        #[arg(long, value_enum, env = "CONCLAVE_SANDBOX")]
        sandbox: Option<SandboxBackendKind>,
    },
    /// Serve the sandbox MCP tools over stdio, for IDEs that start their
    /// MCP servers as commands. Sessions named by `session_id` are those of
    /// the server using the same data directory.
    Mcp {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Directory of the store (default ./data).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        #[arg(long, value_enum, env = "CONCLAVE_SANDBOX")]
        sandbox: Option<SandboxBackendKind>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    conclave::telemetry::init_logging();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            data_dir,
            sandbox,
        } => {
            let config = Config::load(
                config.as_deref(),
                &Overrides {
                    listen,
                    data_dir,
                    sandbox,
                },
            )?;
            raise_fd_limit();
            let listener = conclave::server::bind(config.listen)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
            let root = CancellationToken::new();
            conclave::shutdown::on_signal(root.clone());
            let server = Server::build(config, Tools::Sandboxed, root).await?;
            let addr = listener.local_addr()?;
            // One plain line on stdout, for people and for scripts that
            // started the server on port 0.
            println!("conclave listening on http://{addr}");
            tracing::info!(
                listen = %addr,
                model = server.state.sessions.models().default_model(),
                auth = server.state.keys.enabled(),
                "conclave serving"
            );
            server.run(listener).await?;
            tracing::info!("stopped");
            Ok(())
        }
        Command::Mcp {
            config,
            data_dir,
            sandbox,
        } => {
            let config = Config::load(
                config.as_deref(),
                &Overrides {
                    listen: None,
                    data_dir,
                    sandbox,
                },
            )?;
            conclave::mcp::serve_stdio(config).await?;
            Ok(())
        }
    }
}

/// Each stream and WebSocket holds a descriptor: lift the soft limit to the
/// hard one.
fn raise_fd_limit() {
    if let Ok((soft, hard)) = rlimit::Resource::NOFILE.get()
        && soft < hard
        && let Err(e) = rlimit::Resource::NOFILE.set(hard, hard)
    {
        tracing::warn!(error = %e, "cannot raise the open-file limit");
    }
}
