//! A fake Kubernetes API server for the kubernetes sandbox backend.
//!
//! It speaks the parts of the API the backend uses: create, get, list and
//! delete Pods, and exec over a WebSocket in the `v5.channel.k8s.io`
//! protocol (first byte of each binary frame the channel: 0 stdin, 1
//! stdout, 2 stderr, 3 status, 255 close). Like an admission webhook it
//! refuses (422) a Pod that breaks the hardening rules, and records why.
//!
//! Exec plays the kubelet: the argv really runs on this host (so the
//! backend's wrapper and kill scripts run in a real `sh`), except a `grep`
//! of the cgroup files, which gets fixed numbers so stats can be compared.
//! Every request is recorded in a `watch` channel that tests wait on.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

/// The cgroup numbers a stats exec reads.
pub const CGROUP_TEXT: &str = "/sys/fs/cgroup/memory.current:1048576\n\
     /sys/fs/cgroup/pids.current:4\n\
     /sys/fs/cgroup/cpu.stat:usage_usec 1000\n";

/// One request as the fake received it.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    Create(Value),
    Get(String),
    List {
        label_selector: String,
    },
    Delete {
        name: String,
        body: Value,
    },
    Patch {
        name: String,
        content_type: String,
        body: Value,
    },
    Exec {
        pod: String,
        query: Vec<(String, String)>,
        argv: Vec<String>,
    },
}

pub struct FakeApiServer {
    pub url: String,
    pub namespace: String,
    state: Arc<FakeState>,
    server: tokio::task::JoinHandle<()>,
}

struct FakeState {
    namespace: String,
    /// Images whose Pods report `ErrImagePull`.
    bad_images: BTreeSet<String>,
    /// Stored Pods by name, with how often each was read.
    pods: Mutex<BTreeMap<String, (Value, u32)>>,
    violations: Mutex<Vec<String>>,
    recorded: watch::Sender<Vec<Recorded>>,
}

impl FakeApiServer {
    pub async fn start(namespace: &str, bad_images: &[&str]) -> FakeApiServer {
        let state = Arc::new(FakeState {
            namespace: namespace.into(),
            bad_images: bad_images.iter().map(|s| s.to_string()).collect(),
            pods: Mutex::new(BTreeMap::new()),
            violations: Mutex::new(Vec::new()),
            recorded: watch::Sender::new(Vec::new()),
        });
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods", get(list).post(create))
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                get(read).delete(delete).patch(patch),
            )
            .route("/api/v1/namespaces/{ns}/pods/{name}/exec", get(exec))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeApiServer {
            url,
            namespace: namespace.into(),
            state,
            server,
        }
    }

    /// A kube client for this server: no TLS, no auth, the fake's namespace.
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url.parse().unwrap());
        config.default_namespace = self.namespace.clone();
        kube::Client::try_from(config).unwrap()
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.state.recorded.borrow().clone()
    }

    /// Waits until a recorded request matches `pred`, and returns it.
    pub async fn wait_for(&self, pred: impl Fn(&Recorded) -> bool) -> Recorded {
        let mut rx = self.state.recorded.subscribe();
        let all = rx.wait_for(|all| all.iter().any(&pred)).await.unwrap();
        all.iter().find(|r| pred(r)).cloned().unwrap()
    }

    pub fn pod_names(&self) -> Vec<String> {
        self.state.pods.lock().unwrap().keys().cloned().collect()
    }

    /// Stores a Pod as if someone else had created it.
    pub fn insert_pod(&self, name: &str, labels: Value) {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "spec": {"containers": [{"name": "sandbox", "image": "other"}]}
        });
        self.state
            .pods
            .lock()
            .unwrap()
            .insert(name.into(), (pod, 1));
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.violations.lock().unwrap().clone()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeState {
    fn record(&self, request: Recorded) {
        self.recorded.send_modify(|all| all.push(request));
    }

    /// The refusal of a request outside the fake's namespace, recorded: a
    /// wrong namespace is the backend's bug, not the caller's.
    fn refuse_namespace(&self, ns: &str) -> Option<Response> {
        if ns == self.namespace {
            return None;
        }
        let why = format!("request for namespace {ns}, expected {}", self.namespace);
        self.violations.lock().unwrap().push(why.clone());
        Some(status(StatusCode::FORBIDDEN, "Forbidden", &why))
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()
    });
    (code, axum::Json(body)).into_response()
}

fn not_found(name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("pods \"{name}\" not found"),
    )
}

async fn create(
    State(state): State<Arc<FakeState>>,
    Path(ns): Path<String>,
    axum::Json(pod): axum::Json<Value>,
) -> Response {
    state.record(Recorded::Create(pod.clone()));
    if let Some(refusal) = state.refuse_namespace(&ns) {
        return refusal;
    }
    let problems = restricted_violations(&pod);
    if !problems.is_empty() {
        let why = problems.join("; ");
        state.violations.lock().unwrap().push(why.clone());
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &why);
    }
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut pods = state.pods.lock().unwrap();
    if pods.contains_key(&name) {
        return status(StatusCode::CONFLICT, "AlreadyExists", "pod exists");
    }
    pods.insert(name, (pod.clone(), 0));
    (StatusCode::CREATED, axum::Json(pod)).into_response()
}

/// What the hardening rules (Pod Security "restricted" and Conclave's own)
/// find wrong with `pod`.
fn restricted_violations(pod: &Value) -> Vec<String> {
    let spec = &pod["spec"];
    let pod_sc = &spec["securityContext"];
    let mut problems = Vec::new();
    let mut want = |ok: bool, what: &str| {
        if !ok {
            problems.push(what.to_string());
        }
    };
    want(
        pod["metadata"]["labels"]["conclave.managed"] == "true",
        "label conclave.managed=true",
    );
    want(
        matches!(
            pod["metadata"]["labels"]["conclave.network"].as_str(),
            Some("none" | "allowed")
        ),
        "label conclave.network none|allowed",
    );
    want(
        spec["automountServiceAccountToken"] == false,
        "automountServiceAccountToken false",
    );
    want(
        spec["enableServiceLinks"] == false,
        "enableServiceLinks false",
    );
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        want(spec[field] != true, &format!("{field} not true"));
    }
    want(spec["serviceAccountName"].is_null(), "no service account");
    want(pod_sc["runAsNonRoot"] == true, "runAsNonRoot");
    want(
        pod_sc["runAsUser"].as_i64().is_some_and(|u| u > 0),
        "runAsUser non-zero",
    );
    want(
        pod_sc["seccompProfile"]["type"] == "RuntimeDefault",
        "seccomp RuntimeDefault",
    );
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        let keys: Vec<&str> = volume
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        want(
            keys == ["emptyDir", "name"],
            &format!("only emptyDir volumes, got {volume}"),
        );
    }
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    want(containers.len() == 1, "one container");
    for container in &containers {
        let sc = &container["securityContext"];
        want(
            sc["allowPrivilegeEscalation"] == false,
            "allowPrivilegeEscalation false",
        );
        want(sc["privileged"] != true, "not privileged");
        want(
            sc["readOnlyRootFilesystem"] == true,
            "readOnlyRootFilesystem",
        );
        want(
            sc["capabilities"]["drop"] == json!(["ALL"]),
            "capabilities drop ALL",
        );
        want(sc["capabilities"]["add"].is_null(), "no capabilities added");
        for resource in ["cpu", "memory", "ephemeral-storage"] {
            want(
                container["resources"]["limits"][resource].is_string(),
                &format!("limit {resource}"),
            );
        }
    }
    problems
}

/// A stored Pod with a status: first still creating its container, then
/// running and ready, or for a bad image stuck pulling it.
async fn read(
    State(state): State<Arc<FakeState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    state.record(Recorded::Get(name.clone()));
    if let Some(refusal) = state.refuse_namespace(&ns) {
        return refusal;
    }
    let mut pods = state.pods.lock().unwrap();
    let Some((pod, reads)) = pods.get_mut(&name) else {
        return not_found(&name);
    };
    *reads += 1;
    let mut pod = pod.clone();
    pod["status"] = pod_status(&state, &pod, *reads);
    axum::Json(pod).into_response()
}

fn pod_status(state: &FakeState, pod: &Value, reads: u32) -> Value {
    let image = pod["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default();
    let waiting = |reason: &str, message: &str| {
        json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "image": image, "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}
        }]})
    };
    if state.bad_images.contains(image) {
        return waiting("ErrImagePull", "manifest unknown");
    }
    if reads < 2 {
        return waiting("ContainerCreating", "");
    }
    json!({"phase": "Running", "startTime": "2025-01-01T00:00:00Z", "containerStatuses": [{
        "name": "sandbox", "image": image, "imageID": "", "ready": true, "restartCount": 0,
        "started": true, "state": {"running": {"startedAt": "2025-01-01T00:00:01Z"}}
    }]})
}

async fn list(
    State(state): State<Arc<FakeState>>,
    Path(ns): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let selector = query.get("labelSelector").cloned().unwrap_or_default();
    state.record(Recorded::List {
        label_selector: selector.clone(),
    });
    if let Some(refusal) = state.refuse_namespace(&ns) {
        return refusal;
    }
    // Equality selectors only (`k=v,k2=v2`), which is all the backend sends.
    let wanted: Vec<(&str, &str)> = selector
        .split(',')
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.split_once('='))
        .collect();
    let pods = state.pods.lock().unwrap();
    let items: Vec<Value> = pods
        .values()
        .filter(|(pod, _)| {
            wanted
                .iter()
                .all(|(k, v)| pod["metadata"]["labels"][*k] == *v)
        })
        .map(|(pod, reads)| {
            let mut pod = pod.clone();
            pod["status"] = pod_status(&state, &pod, *reads);
            pod
        })
        .collect();
    axum::Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}))
        .into_response()
}

async fn delete(
    State(state): State<Arc<FakeState>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.record(Recorded::Delete {
        name: name.clone(),
        body,
    });
    if let Some(refusal) = state.refuse_namespace(&ns) {
        return refusal;
    }
    match state.pods.lock().unwrap().remove(&name) {
        Some((pod, _)) => axum::Json(pod).into_response(),
        None => not_found(&name),
    }
}

/// A JSON merge patch (RFC 7386), the only patch type the backend sends;
/// any other content type is refused as the API server refuses one it does
/// not know.
async fn patch(
    State(state): State<Arc<FakeState>>,
    Path((ns, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.record(Recorded::Patch {
        name: name.clone(),
        content_type: content_type.clone(),
        body: body.clone(),
    });
    if let Some(refusal) = state.refuse_namespace(&ns) {
        return refusal;
    }
    if content_type != "application/merge-patch+json" {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            &format!("the body of the request was in an unknown format: {content_type}"),
        );
    }
    let mut pods = state.pods.lock().unwrap();
    let Some((pod, reads)) = pods.get_mut(&name) else {
        return not_found(&name);
    };
    merge_patch(pod, &body);
    let mut pod = pod.clone();
    pod["status"] = pod_status(&state, &pod, *reads);
    axum::Json(pod).into_response()
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(into) = target else {
        return;
    };
    for (key, value) in fields {
        if value.is_null() {
            into.remove(key);
        } else {
            merge_patch(into.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

async fn exec(
    State(state): State<Arc<FakeState>>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let argv: Vec<String> = query
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    state.record(Recorded::Exec {
        pod: name.clone(),
        query: query.clone(),
        argv: argv.clone(),
    });
    if let Some(refusal) = state.refuse_namespace(&ns) {
        return refusal;
    }
    if !state.pods.lock().unwrap().contains_key(&name) {
        return not_found(&name);
    }
    let flag = |key: &str| query.iter().any(|(k, v)| k == key && v == "true");
    if !(flag("stdout") && flag("stderr")) || flag("tty") || argv.is_empty() {
        let why = format!("exec wants stdout and stderr, no tty, a command: {query:?}");
        state.violations.lock().unwrap().push(why.clone());
        return status(StatusCode::BAD_REQUEST, "BadRequest", &why);
    }
    if !query.contains(&("container".into(), "sandbox".into())) {
        state
            .violations
            .lock()
            .unwrap()
            .push(format!("exec names no container: {query:?}"));
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "container name required",
        );
    }
    let offered_v5 = upgrade
        .requested_protocols()
        .any(|p| p.as_bytes() == b"v5.channel.k8s.io");
    if !offered_v5 {
        state
            .violations
            .lock()
            .unwrap()
            .push("exec did not offer v5.channel.k8s.io".into());
    }
    let stdin = flag("stdin");
    upgrade
        .protocols(["v5.channel.k8s.io"])
        .on_upgrade(move |socket| run_exec(socket, argv, stdin))
}

/// Runs `argv` here and plays its streams over the channel protocol.
async fn run_exec(socket: WebSocket, argv: Vec<String>, stdin: bool) {
    let (mut sink, mut stream) = socket.split();
    // Frames to the client go through one task, so the output pumps and the
    // final status never interleave mid-frame.
    let (frames, mut frames_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = frames_rx.recv().await {
            // The client may have gone (timeout, cancel); the process runs on,
            // as under a real kubelet.
            let _ = sink.send(Message::Binary(frame.into())).await;
        }
        let _ = sink.close().await;
    });
    // The API server opens each stream with an empty frame.
    for channel in [1u8, 2] {
        let _ = frames.send(vec![channel]);
    }
    if is_cgroup_read(&argv) {
        let _ = frames.send([&[1u8][..], CGROUP_TEXT.as_bytes()].concat());
        let _ = frames.send(status_frame(0));
        drop(frames);
        let _ = writer.await;
        return;
    }
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child_stdin = child.stdin.take();
    let stdout = pump(child.stdout.take().unwrap(), 1, frames.clone());
    let stderr = pump(child.stderr.take().unwrap(), 2, frames.clone());
    let input = async {
        while let Some(Ok(message)) = stream.next().await {
            let Message::Binary(data) = message else {
                continue;
            };
            match (data.first(), child_stdin.as_mut()) {
                (Some(0), Some(pipe)) => {
                    let _ = pipe.write_all(&data[1..]).await;
                }
                (Some(255), _) if data.get(1) == Some(&0) => child_stdin = None,
                _ => {}
            }
        }
    };
    // Output ends when the process and its children close the pipes; input
    // ends with the connection, which may close first (timeout, cancel).
    let output = async { tokio::join!(stdout, stderr) };
    tokio::pin!(output);
    tokio::select! {
        _ = &mut output => {}
        () = input => { output.await; }
    }
    let code = child.wait().await.unwrap();
    let code = code.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + code.signal().unwrap_or(0)
    });
    let _ = frames.send(status_frame(code));
    drop(frames);
    let _ = writer.await;
}

fn is_cgroup_read(argv: &[String]) -> bool {
    argv.iter().any(|a| a == "grep") && argv.iter().any(|a| a.starts_with("/sys/fs/cgroup/"))
}

async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    channel: u8,
    frames: mpsc::UnboundedSender<Vec<u8>>,
) {
    let mut buf = vec![0; 4096];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let _ = frames.send([&[channel][..], &buf[..n]].concat());
    }
}

/// The status the kubelet sends on channel 3 when the process ends.
fn status_frame(code: i32) -> Vec<u8> {
    let status = if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
        })
    };
    [&[3u8][..], &serde_json::to_vec(&status).unwrap()].concat()
}
