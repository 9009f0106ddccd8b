//! Loading, path resolution and validation of the configuration.

use super::*;

#[test]
fn non_loopback_without_keys_is_refused_naming_listen() {
    let config = Config {
        listen: "0.0.0.0:8080".parse().unwrap(),
        ..Config::default()
    };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("listen"), "{err}");
}

#[test]
fn toml_type_error_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[agent]\nmax_turns = \"many\"\n").unwrap();
    let err = Config::load(Some(&path), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_turns"), "{err}");
}

#[test]
fn unknown_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "listne = \"127.0.0.1:1\"\n").unwrap();
    let err = Config::load(Some(&path), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("listne"), "{err}");
}

#[test]
fn paths_in_the_config_file_resolve_against_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "data_dir = \"state\"\n[sandbox.local]\nroot = \"../boxes\"\n",
    )
    .unwrap();
    let config = Config::load(Some(&path), &Overrides::default()).unwrap();
    assert_eq!(config.data_dir, dir.path().join("state"));
    assert_eq!(config.sandbox.local.root, Some(dir.path().join("../boxes")));
}

#[test]
fn default_and_flag_paths_resolve_against_the_working_directory() {
    let cwd = std::env::current_dir().unwrap();
    let config = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(config.data_dir, cwd.join("data"));
    assert_eq!(config.sandbox.local.root, None);

    let overrides = Overrides {
        data_dir: Some(PathBuf::from("rel/dir")),
        ..Overrides::default()
    };
    let config = Config::load(None, &overrides).unwrap();
    assert_eq!(config.data_dir, cwd.join("rel/dir"));

    let absolute = Overrides {
        data_dir: Some(PathBuf::from("/var/lib/conclave")),
        ..Overrides::default()
    };
    let config = Config::load(None, &absolute).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/conclave"));
}

#[test]
fn an_empty_or_relative_data_dir_is_refused_naming_it() {
    let empty = Overrides {
        data_dir: Some(PathBuf::new()),
        ..Overrides::default()
    };
    let err = Config::load(None, &empty).unwrap_err().to_string();
    assert!(err.contains("data_dir: must not be empty"), "{err}");
    // A config built in code skips load; validate still refuses it.
    let err = Config::default().validate().unwrap_err().to_string();
    assert!(
        err.contains("data_dir: data is not an absolute path"),
        "{err}"
    );
}

#[test]
fn keys_from_a_comma_separated_string() {
    let keys: Config = Figment::from(Serialized::defaults(Config::default()))
        .merge(Serialized::default("api_keys", "key-one-1, key-two-2"))
        .extract()
        .unwrap();
    assert_eq!(keys.api_keys, vec!["key-one-1", "key-two-2"]);
}

#[test]
fn provider_env_overrides_the_file() {
    let mut config = Config {
        openai: Some(ProviderConfig {
            base_url: "http://127.0.0.1:9/v1".into(),
            api_key: None,
            default_model: Some("gpt-4o-mini".into()),
            max_retries: 3,
            timeout_s: 600,
            harness: None,
        }),
        ..Config::default()
    };
    config
        .apply_provider_env(|name| match name {
            "OPENAI_MODEL" => Some("qwen2.5-coder".into()),
            _ => None,
        })
        .unwrap();
    let openai = config.openai.expect("openai");
    assert_eq!(openai.default_model.as_deref(), Some("qwen2.5-coder"));
    assert_eq!(
        openai.base_url, "http://127.0.0.1:9/v1",
        "kept from the file"
    );
}

#[test]
fn provider_env_fills_openai() {
    let mut config = Config::default();
    config
        .apply_provider_env(|name| match name {
            "OPENAI_BASE_URL" => Some("http://127.0.0.1:9/v1".into()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        config.openai.as_ref().map(|p| p.base_url.as_str()),
        Some("http://127.0.0.1:9/v1")
    );
    assert_eq!(config.openai.as_ref().and_then(|p| p.harness), None);
    assert!(config.anthropic.is_none());
}

#[test]
fn openai_harness_sets_the_providers_harness_and_refuses_nonsense() {
    let with = |harness: &'static str, url: bool| {
        let mut config = Config::default();
        config
            .apply_provider_env(move |name| match name {
                "OPENAI_BASE_URL" if url => Some("http://127.0.0.1:9/v1".into()),
                "OPENAI_HARNESS" => Some(harness.into()),
                _ => None,
            })
            .map(|()| config.openai.and_then(|p| p.harness))
            .map_err(|e| e.to_string())
    };
    assert_eq!(with("small", true), Ok(Some(HarnessKind::Small)));
    assert_eq!(with("strict", true), Ok(Some(HarnessKind::Strict)));
    let err = with("tiny", true).unwrap_err();
    assert!(
        err.contains("OPENAI_HARNESS") && err.contains("\"small\""),
        "{err}"
    );
    let err = with("small", false).unwrap_err();
    assert!(err.contains("OPENAI_BASE_URL"), "{err}");
}

#[test]
fn a_default_data_dir_yields_to_the_flag() {
    let with_default = Overrides {
        default_data_dir: Some(PathBuf::from("/srv/conclave")),
        ..Overrides::default()
    };
    let config = Config::load(None, &with_default).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/srv/conclave"));
    let both = Overrides {
        data_dir: Some(PathBuf::from("/flag")),
        ..with_default
    };
    let config = Config::load(None, &both).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/flag"));
}

#[test]
fn a_shared_store_bus_and_cluster_are_checked_naming_the_field() {
    let refused = |config: Config| config.validate().unwrap_err().to_string();
    let base = || Config {
        data_dir: PathBuf::from("/var/lib/conclave"),
        ..Config::default()
    };
    let err = refused(Config {
        store: Some("mysql://db/conclave".into()),
        ..base()
    });
    assert!(
        err.contains("store:") && err.contains("PostgreSQL"),
        "{err}"
    );
    let mut config = base();
    config.bus.url = Some("redis://127.0.0.1:6379".into());
    let err = refused(config);
    assert!(err.contains("bus.url") && err.contains("NATS"), "{err}");
    let mut config = base();
    config.cluster.turn_lease_s = 1;
    assert!(refused(config).contains("cluster.turn_lease_s"));
    let mut config = base();
    config.cluster.store_connections = Some(0);
    assert!(refused(config).contains("cluster.store_connections"));

    // The pool: twice the cores, 4 to 16, unless set.
    let cores = std::thread::available_parallelism().unwrap().get() as u32;
    let mut cluster = crate::config::ClusterConfig::default();
    assert_eq!(cluster.store_connections(), (2 * cores).clamp(4, 16));
    cluster.store_connections = Some(40);
    assert_eq!(cluster.store_connections(), 40);

    let overrides = Overrides {
        store: Some("postgres://conclave@db/conclave".into()),
        bus: Some("nats://nats:4222".into()),
        ..Overrides::default()
    };
    let config = Config::load(None, &overrides).unwrap();
    config.validate().unwrap();
    assert_eq!(
        config.store.as_deref(),
        Some("postgres://conclave@db/conclave")
    );
    assert_eq!(config.bus.url.as_deref(), Some("nats://nats:4222"));
}

/// A model runs under `strict` unless its config says `small`; the
/// deprecated small-model keys still select `small`, and clash with an
/// explicit `strict`, naming the field.
#[test]
fn harnesses_and_the_deprecated_keys_that_select_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let load = |models: &str| {
        std::fs::write(&path, models).unwrap();
        Config::load(Some(&path), &Overrides::default())
    };
    let model = "[models.m]\nprovider = \"demo\"\nmodel = \"demo\"\n";
    let harness = |extra: &str| load(&format!("{model}{extra}")).unwrap().models["m"].harness();
    assert_eq!(harness(""), HarnessKind::Strict);
    assert_eq!(harness("harness = \"small\"\n"), HarnessKind::Small);
    assert_eq!(harness("answer_after_output = true\n"), HarnessKind::Small);
    assert_eq!(
        harness("tool_call_mode = \"json_schema\"\n"),
        HarnessKind::Small
    );
    assert_eq!(
        harness("answer_after_output = false\n"),
        HarnessKind::Strict
    );
    let err = load(&format!(
        "{model}harness = \"strict\"\nanswer_after_output = true\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("models.m.harness") && err.contains("answer_after_output"),
        "{err}"
    );
    let err = load(&format!("{model}harness = \"tiny\"\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("harness"), "{err}");
}

#[test]
fn replicas_added_at_run_time_may_be_on_loopback_only_where_the_server_is() {
    let on = |listen: &str, list: Option<Vec<String>>| {
        let mut config = Config {
            listen: listen.parse().unwrap(),
            ..Config::default()
        };
        config.gateway.allowed_upstreams = list;
        config.allowed_upstreams()
    };
    assert_eq!(on("127.0.0.1:8080", None), ["public", "127.0.0.0/8", "::1"]);
    assert_eq!(on("[::1]:8080", None), ["public", "127.0.0.0/8", "::1"]);
    assert_eq!(on("0.0.0.0:8080", None), ["public"]);
    // What the operator writes is the list, wherever the server listens.
    assert_eq!(
        on("127.0.0.1:8080", Some(vec!["public".into()])),
        ["public"]
    );
    assert_eq!(
        on("0.0.0.0:8080", Some(vec!["10.0.0.0/8".into()])),
        ["10.0.0.0/8"]
    );
}

/// Pausing is off unless asked for, and a pause that would come no sooner
/// than the idle TTL's destruction is refused, naming the field.
#[test]
fn sandbox_pause_after_s_is_off_by_default_and_below_the_idle_ttl() {
    let base = || Config {
        data_dir: PathBuf::from("/var/lib/conclave"),
        ..Config::default()
    };
    assert_eq!(base().sandbox.pause_after_s, 0);
    base().validate().unwrap();
    let mut config = base();
    config.sandbox.pause_after_s = 60;
    config.validate().unwrap();
    config.sandbox.pause_after_s = config.sandbox.idle_ttl_s;
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("sandbox.pause_after_s") && err.contains("idle_ttl_s"),
        "{err}"
    );
}

#[test]
fn named_keys_and_the_default_quota_load_and_are_checked_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Config::load(Some(&path), &Overrides::default()).map_err(|e| e.to_string())
    };
    let config = load(
        "listen = \"0.0.0.0:8080\"\n[keys.alice]\nkey = \"alice-secret-1\"\nmax_sandboxes = 2\n\
         [default_quota]\ntokens_per_day = 5000\n",
    )
    .unwrap();
    let alice = &config.key_entries()[0];
    assert_eq!(alice.name, "alice");
    assert_eq!(alice.quota.max_sandboxes, Some(2));
    assert_eq!(alice.quota.tokens_per_day, Some(5000));
    // The built-in default still bounds storage though the file set
    // another field of [default_quota].
    assert_eq!(alice.quota.storage_mb, Some(1024));

    let err = load("[keys.alice]\nkey = \"short\"\n").unwrap_err();
    assert!(err.contains("keys.alice.key"), "{err}");
    let err = load("[keys.\"a b\"]\nkey = \"alice-secret-1\"\n").unwrap_err();
    assert!(err.contains("keys.a b"), "{err}");
    let err = load("[keys.alice]\nkey = \"alice-secret-1\"\nusd_per_day = -1\n").unwrap_err();
    assert!(err.contains("keys.alice.usd_per_day"), "{err}");
    let err = load("[keys.alice]\nkey = \"alice-secret-1\"\nmax_sandbox = 1\n").unwrap_err();
    assert!(err.contains("max_sandbox"), "{err}");
    let err = load("api_keys = [\"alice-secret-1\"]\n[keys.alice]\nkey = \"alice-secret-1\"\n")
        .unwrap_err();
    assert!(err.contains("configured twice"), "{err}");
    // Never the secret in an error.
    assert!(!err.contains("alice-secret-1"), "{err}");
}

/// A misspelt key is named with the key it most likely meant, and a wrong
/// type in words rather than Rust's.
#[test]
fn config_errors_say_what_a_typo_meant_and_types_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Config::load(Some(&path), &Overrides::default())
            .unwrap_err()
            .to_string()
    };
    let typo = load("[agent]\nmax_turnz = 3\n");
    assert!(
        typo.contains("unknown field `max_turnz`; did you mean `max_turns`?"),
        "{typo}"
    );
    let wrong = load("[agent]\nmax_turns = \"three\"\n");
    assert!(
        wrong.contains("expected a whole number from 0 to 4294967295"),
        "{wrong}"
    );
    assert!(!wrong.contains("u32"), "{wrong}");
}
