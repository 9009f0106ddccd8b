//! `deploy/`, checked offline (no cluster and no image registry here):
//!
//! - every Kubernetes manifest parses into its k8s-openapi type with no
//!   field dropped (a misspelt or misplaced field fails, naming its path),
//!   and the references between them resolve: selectors, named ports,
//!   probes, the service account and its Role, ConfigMaps and Secrets,
//!   namespaces, the external services the config names, the drain time
//!   against the grace period, the NetworkPolicies against the sandbox
//!   namespace and labels;
//! - the ConfigMap's `config.toml` is a valid server configuration;
//! - `compose.yaml`'s services, builds, volumes, dependencies and variables
//!   exist, and the proxy's config names the three replicas.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// The paths of `input` that `output` lacks or holds otherwise.
fn lost(input: &Value, output: &Value, path: &str, found: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                match b.get(key) {
                    Some(kept) => lost(value, kept, &format!("{path}.{key}"), found),
                    None => found.push(format!("{path}.{key}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (value, kept)) in a.iter().zip(b).enumerate() {
                lost(value, kept, &format!("{path}[{i}]"), found);
            }
        }
        (a, b) if a == b => {}
        (a, b) => found.push(format!("{path}: {a} became {b}")),
    }
}

/// `doc` as a `T`, refusing fields the type does not know: what
/// deserializing drops is missing when the value is serialized back.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value, at: &str) -> T {
    let parsed: T = serde_path_to_error::deserialize(doc.clone())
        .unwrap_or_else(|e| panic!("{at}: {} at {}", e.inner(), e.path()));
    let mut found = Vec::new();
    lost(doc, &serde_json::to_value(&parsed).unwrap(), "", &mut found);
    assert!(found.is_empty(), "{at}: unknown or misplaced {found:?}");
    parsed
}

#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    budgets: Vec<PodDisruptionBudget>,
    config_maps: Vec<ConfigMap>,
    accounts: Vec<ServiceAccount>,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
    policies: Vec<NetworkPolicy>,
}

fn manifests() -> Manifests {
    let dir = deploy_dir().join("kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut all = Manifests::default();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, document) in yaml_serde::Deserializer::from_str(&text).enumerate() {
            let at = format!("{} document {i}", file.display());
            let doc: Value =
                serde::Deserialize::deserialize(document).unwrap_or_else(|e| panic!("{at}: {e}"));
            let kind = (doc["apiVersion"].as_str(), doc["kind"].as_str());
            match kind {
                (Some("v1"), Some("Namespace")) => all.namespaces.push(typed(&doc, &at)),
                (Some("apps/v1"), Some("Deployment")) => all.deployments.push(typed(&doc, &at)),
                (Some("v1"), Some("Service")) => all.services.push(typed(&doc, &at)),
                (Some("policy/v1"), Some("PodDisruptionBudget")) => {
                    all.budgets.push(typed(&doc, &at))
                }
                (Some("v1"), Some("ConfigMap")) => all.config_maps.push(typed(&doc, &at)),
                (Some("v1"), Some("ServiceAccount")) => all.accounts.push(typed(&doc, &at)),
                (Some("rbac.authorization.k8s.io/v1"), Some("Role")) => {
                    all.roles.push(typed(&doc, &at))
                }
                (Some("rbac.authorization.k8s.io/v1"), Some("RoleBinding")) => {
                    all.bindings.push(typed(&doc, &at))
                }
                (Some("networking.k8s.io/v1"), Some("NetworkPolicy")) => {
                    all.policies.push(typed(&doc, &at))
                }
                other => panic!("{at}: a kind this test does not check: {other:?}"),
            }
        }
    }
    all
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().expect("every object is named")
}

fn namespace(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace
        .as_deref()
        .unwrap_or_else(|| panic!("{} names no namespace", name(meta)))
}

/// Whether `selector` (match labels only: these manifests use no
/// expressions) selects a Pod labelled `labels`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn match_labels(selector: &LabelSelector) -> &BTreeMap<String, String> {
    assert!(selector.match_expressions.is_none());
    selector.match_labels.as_ref().expect("matchLabels")
}

fn config_toml(config_maps: &[ConfigMap], name: &str, key: &str) -> String {
    let map = config_maps
        .iter()
        .find(|m| m.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no ConfigMap {name}"));
    map.data.as_ref().unwrap()[key].clone()
}

fn container_port(container: &Container, port: &IntOrString) -> i32 {
    let ports = container.ports.as_deref().unwrap_or_default();
    match port {
        IntOrString::Int(number) => {
            assert!(ports.iter().any(|p| p.container_port == *number));
            *number
        }
        IntOrString::String(named) => {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(named.as_str()))
                .unwrap_or_else(|| panic!("no container port named {named}"))
                .container_port
        }
    }
}

/// `host` of a URL like `scheme://user:password@host:port/path`, with port.
fn host_port(url: &str) -> (String, u16) {
    let parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    (
        parsed.host_str().unwrap().to_string(),
        parsed.port().unwrap(),
    )
}

#[test]
fn kubernetes_manifests_parse_and_their_references_resolve() {
    let all = manifests();
    let namespaces: BTreeSet<&str> = all.namespaces.iter().map(|n| name(&n.metadata)).collect();
    assert_eq!(namespaces, BTreeSet::from(["conclave", "conclave-system"]));

    // The server.
    let [deployment] = &all.deployments[..] else {
        panic!("one Deployment")
    };
    let server_ns = namespace(&deployment.metadata);
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    let template = &spec.template;
    let pod_labels = template.metadata.as_ref().unwrap().labels.clone().unwrap();
    assert!(selects(match_labels(&spec.selector), &pod_labels));
    let pod = template.spec.as_ref().unwrap();
    let [container] = &pod.containers[..] else {
        panic!("one container")
    };
    let security = pod.security_context.as_ref().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert!(security.run_as_user.is_some_and(|uid| uid != 0));
    let container_security = container.security_context.as_ref().unwrap();
    assert_eq!(container_security.allow_privilege_escalation, Some(false));
    assert_eq!(container_security.read_only_root_filesystem, Some(true));
    assert!(container.resources.as_ref().unwrap().requests.is_some());

    // The configuration: a valid server config, its file where --config says.
    let mounts = container.volume_mounts.as_deref().unwrap();
    let volumes = pod.volumes.as_deref().unwrap();
    for mount in mounts {
        assert!(
            volumes.iter().any(|v| v.name == mount.name),
            "volume {} is mounted but not declared",
            mount.name
        );
    }
    let args = container.args.as_deref().unwrap();
    let config_path = &args[args.iter().position(|a| a == "--config").unwrap() + 1];
    let (dir, file) = config_path.rsplit_once('/').unwrap();
    let mount = mounts.iter().find(|m| m.mount_path == dir).unwrap();
    let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
    let map_name = &volume.config_map.as_ref().unwrap().name;
    for map in &all.config_maps {
        assert_eq!(namespace(&map.metadata), server_ns);
    }
    let text = config_toml(&all.config_maps, map_name, file);
    let mut config: conclave::config::Config = figment::Figment::from(
        figment::providers::Serialized::defaults(conclave::config::Config::default()),
    )
    .merge(<figment::providers::Toml as figment::providers::Format>::string(&text))
    .extract()
    .unwrap_or_else(|e| panic!("{map_name}/{file}: {e}"));
    let env: BTreeMap<&str, &k8s_openapi::api::core::v1::EnvVar> = container
        .env
        .as_deref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e))
        .collect();
    // Keys come from a Secret; the listener on 0.0.0.0 needs them.
    assert!(env.contains_key("CONCLAVE_API_KEYS"));
    config.api_keys = vec!["from-the-secret".into()];
    let store = env["CONCLAVE_STORE"].value.clone().unwrap();
    config.store = Some(store.clone());
    config
        .validate()
        .unwrap_or_else(|e| panic!("{map_name}/{file}: {e}"));

    // PostgreSQL and NATS: Services of the server's namespace, on the
    // ports the URLs name.
    let bus = config.bus.url.clone().expect("bus.url");
    for (url, service) in [(store.as_str(), "postgres"), (bus.as_str(), "nats")] {
        let (host, port) = host_port(url);
        assert_eq!(host, format!("{service}.{server_ns}.svc"), "{url}");
        let found = all
            .services
            .iter()
            .find(|s| name(&s.metadata) == service && namespace(&s.metadata) == server_ns)
            .unwrap_or_else(|| panic!("no Service {service} in {server_ns}"));
        let service_spec = found.spec.as_ref().unwrap();
        assert_eq!(service_spec.type_.as_deref(), Some("ExternalName"));
        assert!(service_spec.external_name.is_some());
        assert!(
            service_spec
                .ports
                .as_deref()
                .unwrap()
                .iter()
                .any(|p| p.port == i32::from(port)),
            "Service {service} has no port {port}"
        );
    }

    // Env references: the store URL uses variables defined before it; every
    // Secret is one the README tells the operator to create, with its key.
    let readme = std::fs::read_to_string(deploy_dir().join("kubernetes/README.md")).unwrap();
    let names: Vec<&str> = container
        .env
        .as_deref()
        .unwrap()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    let store_at = names.iter().position(|n| *n == "CONCLAVE_STORE").unwrap();
    for (i, variable) in store.split("$(").skip(1).enumerate() {
        let variable = variable.split(')').next().unwrap();
        assert!(
            names[..store_at].contains(&variable),
            "CONCLAVE_STORE's reference {i}, $({variable}), is not defined before it"
        );
    }
    let mut secrets = BTreeSet::new();
    for var in env.values() {
        let Some(secret) = var
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
        else {
            continue;
        };
        let command = format!("create secret generic {}", secret.name);
        let literal = format!("--from-literal={}=", secret.key);
        let documented = readme
            .split("kubectl")
            .any(|c| c.contains(&command) && c.contains(&literal));
        assert!(
            documented,
            "Secret {}/{} is not in README.md's kubectl commands",
            secret.name, secret.key
        );
        secrets.insert(secret.name.clone());
    }
    assert_eq!(
        secrets,
        BTreeSet::from(["conclave-api-keys".into(), "conclave-postgres".into()])
    );

    // Probes: liveness on /health, readiness on /ready, on a declared port,
    // with a Host the server answers.
    for (probe, path) in [
        (container.liveness_probe.as_ref(), "/health"),
        (container.readiness_probe.as_ref(), "/ready"),
    ] {
        let get = probe.unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        container_port(container, &get.port);
        let hosts: Vec<&str> = get
            .http_headers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"))
            .map(|h| h.value.as_str())
            .collect();
        assert_eq!(hosts.len(), 1, "{path}'s probe sets Host");
        assert!(config.allowed_hosts.iter().any(|h| h == hosts[0]));
    }
    // The kubelet waits for the preStop pause and the drain before it kills.
    let pause = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.sleep.as_ref())
        .map_or(0, |s| s.seconds);
    let grace = pod.termination_grace_period_seconds.unwrap();
    assert!(
        grace > pause + config.cluster.drain_s as i64,
        "terminationGracePeriodSeconds {grace} <= preStop {pause} + drain_s {}",
        config.cluster.drain_s
    );

    // The Service in front and the disruption budget select the Pods.
    let front = all
        .services
        .iter()
        .find(|s| s.spec.as_ref().unwrap().selector.is_some())
        .expect("a Service selecting the server");
    assert_eq!(namespace(&front.metadata), server_ns);
    let front_spec = front.spec.as_ref().unwrap();
    assert!(selects(front_spec.selector.as_ref().unwrap(), &pod_labels));
    for port in front_spec.ports.as_deref().unwrap() {
        container_port(container, port.target_port.as_ref().unwrap());
    }
    for host in &config.allowed_hosts[1..] {
        let service = host.split('.').next().unwrap();
        assert_eq!(service, name(&front.metadata), "allowed host {host}");
    }
    let [budget] = &all.budgets[..] else {
        panic!("one PodDisruptionBudget")
    };
    assert_eq!(namespace(&budget.metadata), server_ns);
    let budget_spec = budget.spec.as_ref().unwrap();
    assert!(selects(
        match_labels(budget_spec.selector.as_ref().unwrap()),
        &pod_labels
    ));
    assert_eq!(budget_spec.max_unavailable, Some(IntOrString::Int(1)));

    // RBAC: the Pod's account, bound to the Role in the sandbox namespace.
    let sandbox_ns = config.sandbox.kubernetes.namespace.as_str();
    assert_eq!(
        config.sandbox.backend,
        conclave::config::SandboxBackendKind::Kubernetes
    );
    assert!(namespaces.contains(sandbox_ns) && sandbox_ns != server_ns);
    let account = pod.service_account_name.as_deref().unwrap();
    assert!(
        all.accounts
            .iter()
            .any(|a| name(&a.metadata) == account && namespace(&a.metadata) == server_ns)
    );
    let [binding] = &all.bindings[..] else {
        panic!("one RoleBinding")
    };
    assert_eq!(namespace(&binding.metadata), sandbox_ns);
    assert_eq!(binding.role_ref.kind, "Role");
    assert!(all.roles.iter().any(
        |r| name(&r.metadata) == binding.role_ref.name && namespace(&r.metadata) == sandbox_ns
    ));
    let subjects = binding.subjects.as_deref().unwrap();
    assert!(subjects.iter().any(|s| s.kind == "ServiceAccount"
        && s.name == account
        && s.namespace.as_deref() == Some(server_ns)));

    // NetworkPolicies: in the sandbox namespace, selecting every sandbox
    // Pod (the default deny) and each value of the label the backend sets.
    let mut selected = BTreeSet::new();
    for policy in &all.policies {
        assert_eq!(namespace(&policy.metadata), sandbox_ns);
        let selector = &policy.spec.as_ref().unwrap().pod_selector;
        match selector.as_ref().and_then(|s| s.match_labels.as_ref()) {
            None => {
                selected.insert("*".to_string());
            }
            Some(labels) => {
                assert_eq!(labels.len(), 1);
                let (key, value) = labels.iter().next().unwrap();
                assert_eq!(key, "conclave.network");
                selected.insert(value.clone());
            }
        }
    }
    assert_eq!(
        selected,
        BTreeSet::from(["*".into(), "allowed".into(), "none".into()])
    );
}

/// A `compose.yaml` value as JSON, with YAML merge keys applied.
fn compose() -> Value {
    let text = std::fs::read_to_string(deploy_dir().join("compose.yaml")).unwrap();
    let mut yaml: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    yaml.apply_merge().unwrap();
    serde_json::to_value(yaml).unwrap()
}

/// `text` with each `${NAME…}` replaced by a value, as compose would.
fn interpolated(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("a closing brace") + start;
        out.push_str("value");
        rest = &rest[end + 1..];
    }
    out + rest
}

/// The `${NAME…}` variables a text refers to.
fn variables(text: &str) -> BTreeSet<String> {
    text.split("${")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn compose_services_volumes_and_proxy_resolve() {
    let dir = deploy_dir();
    let compose = compose();
    let services = compose["services"].as_object().unwrap();
    let replicas = ["conclave-1", "conclave-2", "conclave-3"];
    let names: BTreeSet<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "conclave-1",
            "conclave-2",
            "conclave-3",
            "nats",
            "postgres",
            "proxy"
        ])
    );
    let declared: BTreeSet<&str> = compose["volumes"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for (service, spec) in services {
        // An image to pull, or a build whose Dockerfile is here.
        if let Some(build) = spec.get("build") {
            let context = dir.join(build["context"].as_str().unwrap());
            assert!(
                context
                    .join(build["dockerfile"].as_str().unwrap())
                    .is_file(),
                "{service}'s Dockerfile"
            );
        } else {
            assert!(spec["image"].is_string(), "{service} has an image");
        }
        for target in spec
            .get("depends_on")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let (on, condition) = target;
            assert!(services.contains_key(on), "{service} depends on {on}");
            assert_eq!(condition["condition"], "service_healthy");
            assert!(
                services[on]["healthcheck"].is_object(),
                "{on}'s healthcheck"
            );
        }
        assert!(
            spec["healthcheck"]["test"].is_array(),
            "{service}'s healthcheck"
        );
        for volume in spec
            .get("volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let source = volume.as_str().unwrap().split(':').next().unwrap();
            if source.starts_with("./") {
                assert!(dir.join(source).is_file(), "{service} mounts {source}");
            } else if !source.starts_with('/') {
                assert!(declared.contains(source), "{service}'s volume {source}");
            }
        }
        // Only the proxy is reachable from outside.
        assert_eq!(spec.get("ports").is_some(), service == "proxy", "{service}");
    }
    // Replicas: the shared store and bus, by service name and port.
    for replica in replicas {
        let command: Vec<&str> = services[replica]["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(command[0], "serve");
        let flag = |name: &str| {
            interpolated(command[command.iter().position(|c| *c == name).unwrap() + 1])
        };
        assert_eq!(host_port(&flag("--store")), ("postgres".to_string(), 5432));
        assert_eq!(host_port(&flag("--bus")), ("nats".to_string(), 4222));
        assert!(services[replica]["environment"]["CONCLAVE_API_KEYS"].is_string());
        // The others pass live-workspace requests on to it by this name.
        assert_eq!(
            services[replica]["environment"]["CONCLAVE_CLUSTER__ADVERTISE_URL"],
            format!("http://{replica}:8080"),
        );
        assert_eq!(
            services[replica]["environment"]["CONCLAVE_SANDBOX"],
            "docker"
        );
    }
    assert_eq!(services["postgres"]["image"], "postgres:16");
    let nats: Vec<&str> = services["nats"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(nats.contains(&"-js"));
    // Every variable the file uses is in the example environment file.
    let text = std::fs::read_to_string(dir.join("compose.yaml")).unwrap();
    let example = std::fs::read_to_string(dir.join("compose.env.example")).unwrap();
    let defined: BTreeSet<String> = example
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
        .filter(|k| !k.starts_with('#'))
        .collect();
    assert_eq!(variables(&text), defined);
    // The proxy sends to the three replicas on the port they listen on
    // (the image's 8080), checking /ready.
    let proxy = std::fs::read_to_string(dir.join("haproxy.cfg")).unwrap();
    let servers: Vec<(&str, &str)> = proxy
        .lines()
        .filter_map(|l| l.trim().strip_prefix("server "))
        .map(|l| {
            let mut words = l.split_whitespace();
            (words.next().unwrap(), words.next().unwrap())
        })
        .collect();
    let expected: Vec<(&str, String)> =
        replicas.iter().map(|r| (*r, format!("{r}:8080"))).collect();
    assert_eq!(
        servers,
        expected
            .iter()
            .map(|(r, a)| (*r, a.as_str()))
            .collect::<Vec<_>>()
    );
    assert!(proxy.contains("uri /ready"));
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("CONCLAVE_LISTEN=0.0.0.0:8080") && dockerfile.contains("EXPOSE 8080")
    );
}
