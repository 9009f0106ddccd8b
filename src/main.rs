//! The `conclave` command.

/// mimalloc rather than glibc's allocator: a quarter of the gateway's CPU
/// per call went to glibc's malloc and free (benches/notes/routers-cpu.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use conclave::config::{Config, Overrides, SandboxBackendKind};
use conclave::locate::Serving;
use conclave::operator::Prune;
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
        /// A PostgreSQL store shared by replicas (postgres://user@host/db);
        /// default: SQLite in the data directory.
        #[arg(long)]
        store: Option<String>,
        /// A NATS JetStream bus shared by replicas (nats://host:4222);
        /// default: in process.
        #[arg(long)]
        bus: Option<String>,
        /// Where tool calls run (default auto: docker when its socket
        /// answers, else local namespaces).
        #[arg(long, value_enum, env = "CONCLAVE_SANDBOX")]
        sandbox: Option<SandboxBackendKind>,
        /// A LiteLLM proxy config whose `model_list` becomes gateway pools.
        #[arg(long)]
        litellm_config: Option<PathBuf>,
    },
    /// Serve MCP over stdio, for IDEs that start their MCP servers as
    /// commands. With a server to relay to it is that server's `/mcp` under
    /// the key in CONCLAVE_API_KEY: its tools, run_agent and the key's
    /// sessions as resources. The server is --server, else the
    /// `conclave serve` running as this user on the given data directory,
    /// else (none given) the one on ./data here, else the one on the default
    /// address (http://127.0.0.1:8080), else the only one running; several
    /// running and none of those is an error that lists them.
    /// Without one it serves the sandbox tools itself, on the store of the
    /// given data directory or config (else ~/.local/share/conclave).
    Mcp {
        /// Base URL of the server to relay to (e.g. http://127.0.0.1:8080).
        #[arg(long, env = "CONCLAVE_SERVER")]
        server: Option<String>,
        /// The API key sent to that server; prefer the environment
        /// variable, which other users cannot read from the process list.
        #[arg(long, env = "CONCLAVE_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Directory of the store: relays to the server running on it, if
        /// any (default: see above).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// A PostgreSQL store (postgres://user@host/db) for the tools
        /// served here; default: SQLite in the data directory.
        #[arg(long)]
        store: Option<String>,
        #[arg(long, value_enum, env = "CONCLAVE_SANDBOX")]
        sandbox: Option<SandboxBackendKind>,
    },
    /// Ask a server's `/health` and exit 0 when it answers 200: a container
    /// health check that needs no curl in the image.
    Health {
        #[arg(long, default_value = "http://127.0.0.1:8080/health")]
        url: String,
    },
    /// Sandboxes on this host's backend, whichever data directory made them.
    Sandboxes {
        #[command(subcommand)]
        command: SandboxesCommand,
    },
    /// Gateway tools.
    Gateway {
        #[command(subcommand)]
        command: GatewayCommand,
    },
    /// Run an OpenAI-compatible upstream simulator (for tests and
    /// benchmarks of the gateway). `POST /sim/config` changes its settings
    /// while it runs.
    Sim {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        /// Named in every answer, so a client sees which replica served it.
        #[arg(long, default_value = "sim")]
        id: String,
        #[arg(long, default_value = "sim-model")]
        model: String,
        /// Tokens per completion.
        #[arg(long, default_value_t = 16)]
        tokens: u32,
        /// Milliseconds before the first token.
        #[arg(long, default_value_t = 0)]
        ttft_ms: u64,
        /// Pace of the tokens after the first (0: all at once).
        #[arg(long, default_value_t = 0.0)]
        tokens_per_s: f64,
        /// Extra milliseconds before a non-streamed answer.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Share of calls that fail (0.0–1.0), answered with --failure-status.
        #[arg(long, default_value_t = 0.0)]
        failure_rate: f64,
        #[arg(long, default_value_t = 500)]
        failure_status: u16,
        /// A tool call to make when tools are offered:
        /// '{"name": "Bash", "arguments": {"command": "ls"}}'.
        #[arg(long)]
        tool_call: Option<String>,
        /// The completion's text instead of the replica's id and numbered
        /// tokens: '{"choice": 2, "reasoning": "shorter"}'.
        #[arg(long)]
        reply: Option<String>,
        /// Models a prefix cache of this many prompt tokens: the time to
        /// first token adds --prefill-us-per-token for each prompt token
        /// it does not have (0: no cache, no prefill time).
        #[arg(long, default_value_t = 0)]
        prefix_cache_tokens: u64,
        /// Prefill microseconds per uncached prompt token.
        #[arg(long, default_value_t = 50)]
        prefill_us_per_token: u64,
    },
}

/// Where `conclave sandboxes` looks: the backend of a configuration, and
/// the data directory whose instance is `this`.
#[derive(clap::Args)]
struct SandboxesTarget {
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory (default ./data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, value_enum, env = "CONCLAVE_SANDBOX")]
    sandbox: Option<SandboxBackendKind>,
}

#[derive(Subcommand)]
enum SandboxesCommand {
    /// List every sandbox Conclave made on the backend, with its instance
    /// (`this` for the data directory's own), owner and expiry.
    List {
        #[command(flatten)]
        target: SandboxesTarget,
    },
    /// Remove expired sandboxes (any data directory's), and the data
    /// directory's own that no live session owns unless its server runs.
    Prune {
        #[command(flatten)]
        target: SandboxesTarget,
        /// Remove every sandbox Conclave made on the backend, in use or not.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
enum GatewayCommand {
    /// Write the gateway's pools as a LiteLLM proxy config (YAML) on stdout.
    ExportLitellm {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// A LiteLLM config to merge in first (as `serve` would).
        #[arg(long)]
        litellm_config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` starts its log once its config is read, as the config says
    // where traces go.
    if !matches!(cli.command, Command::Serve { .. }) {
        conclave::telemetry::init_logging();
    }
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
            store,
            bus,
            sandbox,
            litellm_config,
        } => {
            let config = Config::load(
                config.as_deref(),
                &Overrides {
                    listen,
                    data_dir,
                    store,
                    bus,
                    sandbox,
                    litellm_config,
                    default_data_dir: None,
                },
            )?;
            let exporter = conclave::telemetry::init(&config.telemetry)
                .map_err(|e| anyhow::anyhow!("telemetry: {e}"))?;
            if let Some(url) = config.telemetry.traces_url() {
                tracing::info!(%url, "exporting traces over OTLP/HTTP");
            }
            let served = serve(config).await;
            // The spans of the last turns are still buffered.
            if let Some(exporter) = exporter {
                let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
            }
            served?;
            tracing::info!("stopped");
            Ok(())
        }
        Command::Mcp {
            server,
            api_key,
            config,
            data_dir,
            store,
            sandbox,
        } => {
            let per_user = std::env::current_dir()?.join(conclave::locate::user_data_dir());
            let config = Config::load(
                config.as_deref(),
                &Overrides {
                    data_dir,
                    store,
                    sandbox,
                    default_data_dir: Some(per_user.clone()),
                    ..Overrides::default()
                },
            )?;
            if let Some(url) = server {
                let from = "given (--server or CONCLAVE_SERVER)";
                tracing::info!(%url, from, "conclave mcp: relaying to a running server");
                return conclave::mcp::proxy::serve_stdio(&url, api_key).await;
            }
            // The per-user directory is where the tools are served when no
            // server runs; named explicitly, it counts as not given.
            let given = (config.data_dir != per_user).then_some(config.data_dir.as_path());
            let here = std::env::current_dir()?.join("data");
            let running = conclave::locate::running_servers();
            match conclave::locate::choose(running, given, &here)? {
                Serving::Relay { server, why } => {
                    tracing::info!(url = %server.url, from = why, "conclave mcp: relaying to a running server");
                    conclave::mcp::proxy::serve_stdio(&server.url, api_key).await
                }
                Serving::InProcess { why } => {
                    tracing::info!(data_dir = %config.data_dir.display(), from = why, "conclave mcp: data directory");
                    conclave::server::serve_mcp_stdio(config).await
                }
            }
        }
        Command::Health { url } => {
            let response = reqwest::Client::new()
                .get(&url)
                .timeout(std::time::Duration::from_secs(2))
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
            if !response.status().is_success() {
                anyhow::bail!("{url} answered {}", response.status());
            }
            Ok(())
        }
        Command::Sandboxes { command } => {
            let (target, how) = match command {
                SandboxesCommand::List { target } => (target, None),
                SandboxesCommand::Prune { target, all } => {
                    (target, Some(if all { Prune::All } else { Prune::Default }))
                }
            };
            let config = Config::load(
                target.config.as_deref(),
                &Overrides {
                    data_dir: target.data_dir,
                    sandbox: target.sandbox,
                    ..Overrides::default()
                },
            )?;
            let report = match how {
                None => conclave::operator::list(&config).await?,
                Some(how) => conclave::operator::prune(&config, how).await?,
            };
            print!("{report}");
            Ok(())
        }
        Command::Gateway {
            command:
                GatewayCommand::ExportLitellm {
                    config,
                    litellm_config,
                },
        } => {
            let config = Config::load(
                config.as_deref(),
                &Overrides {
                    litellm_config,
                    ..Overrides::default()
                },
            )?;
            if config.gateway.pools.is_empty() {
                anyhow::bail!("no gateway pools are configured: nothing to export");
            }
            let yaml = conclave::gateway::litellm::export(&config.gateway)
                .map_err(|e| anyhow::anyhow!(e))?;
            print!("{yaml}");
            Ok(())
        }
        Command::Sim {
            listen,
            id,
            model,
            tokens,
            ttft_ms,
            tokens_per_s,
            latency_ms,
            failure_rate,
            failure_status,
            tool_call,
            reply,
            prefix_cache_tokens,
            prefill_us_per_token,
        } => {
            let tool_call = tool_call
                .map(|text| serde_json::from_str(&text))
                .transpose()
                .map_err(|e| anyhow::anyhow!("--tool-call is not JSON: {e}"))?;
            if !(0.0..=1.0).contains(&failure_rate) {
                anyhow::bail!("--failure-rate must be between 0 and 1");
            }
            let config = conclave::sim::SimConfig {
                id,
                model,
                tokens,
                ttft_ms,
                tokens_per_s,
                latency_ms,
                failure_rate,
                failure_status,
                healthy: true,
                tool_call,
                reply,
                prefix_cache_tokens,
                prefill_us_per_token,
            };
            conclave::sim::serve(listen, config).await
        }
    }
}

/// `conclave serve` once its config is read and its log started.
async fn serve(config: Config) -> anyhow::Result<()> {
    raise_fd_limit();
    let listener = conclave::server::bind(config.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let root = CancellationToken::new();
    let drain = CancellationToken::new();
    conclave::shutdown::on_signal(drain.clone(), root.clone());
    let server = Server::build(config, Tools::Sandboxed, root).await?;
    let addr = listener.local_addr()?;
    // A plain first line on stdout, for people and for scripts that
    // started the server on port 0; then where a person goes next. One
    // write, whose failure is not the server's: a script that read the
    // first line and closed the pipe must not stop it.
    let reach = conclave::locate::ServerRecord::reached_at(addr);
    let key = if server.state.keys.enabled() {
        " -H 'Authorization: Bearer <your key>'"
    } else {
        ""
    };
    let _ = std::io::Write::write_all(
        &mut std::io::stdout().lock(),
        format!(
            "conclave listening on http://{addr}\n  dashboard  {reach}/\n  \
             try        curl -N {reach}/agent/run{key} --json '{{\"prompt\": \"hello\"}}'\n"
        )
        .as_bytes(),
    );
    let recorded = match conclave::locate::record(addr, &server.state.config.data_dir) {
        Ok((record, path)) => {
            tracing::debug!(path = %path.display(), "recorded for conclave mcp");
            Some(record)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot record this server for conclave mcp");
            None
        }
    };
    tracing::info!(
        listen = %addr,
        model = server.state.models.default_model().unwrap_or("not known yet"),
        auth = server.state.keys.enabled(),
        "conclave serving"
    );
    let served = server.run_draining(listener, drain).await;
    if let Some(record) = &recorded {
        conclave::locate::forget(record);
    }
    served?;
    Ok(())
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
