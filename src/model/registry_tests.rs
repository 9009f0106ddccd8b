use super::*;

fn openai_at(base_url: &str) -> Config {
    Config {
        openai: Some(ProviderConfig {
            base_url: base_url.into(),
            api_key: None,
            default_model: None,
            max_retries: 0,
            timeout_s: 5,
            harness: None,
        }),
        ..Config::default()
    }
}

fn price_of(config: &Config, model: &str) -> Option<Price> {
    ModelRegistry::from_config(config)
        .unwrap()
        .resolve(model)
        .unwrap()
        .price
}

#[test]
fn a_provider_s_prices_hold_only_at_its_own_api() {
    let official = Price {
        cache_read_per_mtok: Some(0.075),
        ..Price::new(0.15, 0.6)
    };
    let openai = openai_at("https://api.openai.com/v1");
    assert_eq!(price_of(&openai, "gpt-4o-mini"), Some(official));
    let local = openai_at("http://127.0.0.1:8081/v1");
    assert_eq!(price_of(&local, "gpt-4o-mini"), None);
    assert_eq!(price_of(&local, "claude-sonnet-4-5"), None);

    let mut anthropic = Config {
        anthropic: local.openai.clone(),
        ..Config::default()
    };
    assert_eq!(
        price_of(&anthropic, "sonnet"),
        None,
        "an Anthropic-speaking server"
    );
    anthropic.anthropic.as_mut().unwrap().base_url = "https://api.anthropic.com".into();
    assert_eq!(
        price_of(&anthropic, "sonnet").map(|p| p.input_per_mtok),
        Some(3.0)
    );
}

#[test]
fn config_prices_hold_for_any_provider() {
    let own = Price::new(1.0, 2.0);
    let mut local = openai_at("http://127.0.0.1:8081/v1");
    local.prices.insert("qwen".into(), own);
    local.prices.insert("gpt-4o-mini".into(), own);
    assert_eq!(price_of(&local, "qwen"), Some(own));
    assert_eq!(price_of(&local, "gpt-4o-mini"), Some(own));
    assert_eq!(price_of(&local, "other"), None);
}

#[test]
fn the_default_model_is_listed_only_at_a_server_elsewhere() {
    let default = |config: &Config| {
        ModelRegistry::from_config(config)
            .unwrap()
            .default_model()
            .map(str::to_owned)
    };
    assert_eq!(default(&Config::default()).as_deref(), Some("demo"));
    let openai = openai_at("https://api.openai.com/v1");
    assert_eq!(default(&openai).as_deref(), Some(OPENAI_DEFAULT));
    let mut local = openai_at("http://127.0.0.1:8081/v1");
    assert_eq!(default(&local), None, "read from the server's listing");
    local.openai.as_mut().unwrap().default_model = Some("qwen".into());
    assert_eq!(default(&local).as_deref(), Some("qwen"));
}

#[test]
fn sonnet_without_anthropic_says_to_set_its_key() {
    for config in [Config::default(), openai_at("http://127.0.0.1:8081/v1")] {
        let registry = ModelRegistry::from_config(&config).unwrap();
        let Err(err) = registry.resolve("sonnet") else {
            panic!("sonnet resolved without Anthropic");
        };
        let said = err.to_string();
        assert!(said.contains("set ANTHROPIC_API_KEY"), "{said}");
    }
}

#[test]
fn a_provider_s_harness_holds_for_its_models_that_no_alias_sets() {
    let mut local = openai_at("http://127.0.0.1:8081/v1");
    local.openai.as_mut().unwrap().harness = Some(HarnessKind::Small);
    local.models.insert(
        "capable".into(),
        ModelAlias {
            model: "qwen-32b".into(),
            harness: Some(HarnessKind::Strict),
            ..ModelAlias::default()
        },
    );
    local.models.insert(
        "plain".into(),
        ModelAlias {
            model: "qwen-0.5b".into(),
            ..ModelAlias::default()
        },
    );
    let registry = ModelRegistry::from_config(&local).unwrap();
    let harness = |name: &str| registry.resolve(name).unwrap().harness;
    assert_eq!(harness("qwen2.5-coder"), HarnessKind::Small);
    assert_eq!(harness("plain"), HarnessKind::Small);
    assert_eq!(harness("capable"), HarnessKind::Strict);
    assert_eq!(harness("demo"), HarnessKind::Strict);
}
