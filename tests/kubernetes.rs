//! The kubernetes sandbox backend against a fake API server
//! (`common/k8s_fake.rs`) that checks every request and runs exec'd
//! commands on this host, so the backend's shell wrapper and kill script
//! run for real.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/k8s_fake.rs"]
mod k8s_fake;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use conclave::sandbox::kubernetes::{KubernetesBackend, KubernetesConfig};
use conclave::sandbox::{
    ExecChunk, ExecRequest, ExecStatus, LABEL_INSTANCE, LABEL_MANAGED, LABEL_POOL, LABEL_SESSION,
    ManagedSandbox, Sandbox, SandboxBackend, SandboxError, SandboxSpec,
};
use k8s_fake::{FakeApiServer, Recorded};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NS: &str = "sandboxes";
const IMAGE: &str = "conclave-sandbox-python:latest";
const BAD_IMAGE: &str = "conclave-sandbox-missing:latest";
const SESSION: &str = "6f1c2a4e-0d7b-4f43-9a51-2c8e5b7d9f10";

fn spec() -> SandboxSpec {
    SandboxSpec {
        image: IMAGE.into(),
        cpus: 0.5,
        memory_mb: 512,
        pids: 256,
        disk_mb: 1024,
        network: false,
        egress: None,
        env: BTreeMap::from([("LANG".into(), "C.UTF-8".into())]),
        labels: BTreeMap::from([
            (LABEL_MANAGED.into(), "true".into()),
            (LABEL_SESSION.into(), SESSION.into()),
        ]),
    }
}

async fn setup() -> (FakeApiServer, KubernetesBackend) {
    let fake = FakeApiServer::start(NS, &[BAD_IMAGE]).await;
    let config = KubernetesConfig {
        namespace: NS.into(),
        runtime_class: Some("gvisor".into()),
        ..KubernetesConfig::default()
    };
    let backend = KubernetesBackend::new(fake.client(), config);
    (fake, backend)
}

/// A command in `dir` with a generous timeout.
fn request(dir: &std::path::Path, script: &str) -> ExecRequest {
    let mut request = ExecRequest::shell(script, Duration::from_secs(60));
    request.workdir = dir.to_str().unwrap().into();
    request
}

/// Runs `request` to the end, returning its status, stdout and stderr.
async fn run(sandbox: &dyn Sandbox, request: ExecRequest) -> (ExecStatus, String, String) {
    let (tx, mut rx) = mpsc::channel(16);
    let status = sandbox
        .exec(request, tx, CancellationToken::new())
        .await
        .unwrap();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    while let Some(chunk) = rx.recv().await {
        match chunk {
            ExecChunk::Stdout(d) => stdout.push_str(std::str::from_utf8(&d).unwrap()),
            ExecChunk::Stderr(d) => stderr.push_str(std::str::from_utf8(&d).unwrap()),
        }
    }
    (status, stdout, stderr)
}

/// Waits for the first stdout chunk of a running exec.
async fn first_stdout(rx: &mut mpsc::Receiver<ExecChunk>) -> Bytes {
    loop {
        if let ExecChunk::Stdout(data) = rx.recv().await.unwrap() {
            return data;
        }
    }
}

/// The marker the exec of `script` ran under, from its recorded argv
/// (`/bin/sh -c WRAPPER conclave-exec DIR N CONCLAVE_EXEC=… …`).
fn marker_of(fake: &FakeApiServer, script: &str) -> String {
    fake.recorded()
        .iter()
        .find_map(|r| match r {
            Recorded::Exec { argv, .. } if argv.last().map(String::as_str) == Some(script) => {
                Some(argv[6].strip_prefix("CONCLAVE_EXEC=").unwrap().to_string())
            }
            _ => None,
        })
        .unwrap()
}

/// Pids on this host whose environment carries the exec marker.
fn marked_processes(marker: &str) -> Vec<u32> {
    let needle = format!("CONCLAVE_EXEC={marker}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

fn kill_recorded(fake: &FakeApiServer, marker: &str) -> bool {
    fake.recorded().iter().any(|r| {
        matches!(r, Recorded::Exec { argv, .. }
            if argv.get(3).map(String::as_str) == Some("conclave-kill")
                && argv.get(4).map(String::as_str) == Some(marker))
    })
}

#[tokio::test]
async fn create_sends_a_hardened_pod_and_returns_once_it_runs() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let name = sandbox.id().to_string();
    let suffix = name.strip_prefix("conclave-sbx-").unwrap();
    assert!(
        suffix.len() == 12 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );

    let limits = json!({"cpu": "500m", "ephemeral-storage": "1024Mi", "memory": "512Mi"});
    let expected = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "conclave.managed": "true",
                "conclave.network": "none",
                "conclave.session": SESSION
            }
        },
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"],
                "env": [{"name": "LANG", "value": "C.UTF-8"}],
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "name": "sandbox",
                "resources": {"limits": limits, "requests": limits},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "privileged": false,
                    "readOnlyRootFilesystem": true
                },
                "volumeMounts": [
                    {"mountPath": "/workspace", "name": "workspace"},
                    {"mountPath": "/tmp", "name": "tmp"}
                ],
                "workingDir": "/workspace"
            }],
            "enableServiceLinks": false,
            "hostIPC": false,
            "hostNetwork": false,
            "hostPID": false,
            "restartPolicy": "Never",
            "runtimeClassName": "gvisor",
            "securityContext": {
                "fsGroup": 1000,
                "runAsGroup": 1000,
                "runAsNonRoot": true,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "volumes": [
                {"emptyDir": {"sizeLimit": "1024Mi"}, "name": "workspace"},
                {"emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}, "name": "tmp"}
            ]
        }
    });
    let recorded = fake.recorded();
    assert_eq!(recorded[0], Recorded::Create(expected));
    // The fake answers ContainerCreating first: create must have polled on.
    let gets = recorded
        .iter()
        .filter(|r| **r == Recorded::Get(name.clone()))
        .count();
    assert!(gets >= 2, "{recorded:?}");
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn exec_streams_output_as_it_comes_with_env_and_workdir() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("go");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let script =
        r#"echo first; read go < go; echo warn >&2; printf '%s in %s\n' "$GREETING" "$PWD""#;
    let mut request = request(dir.path(), script);
    request
        .env
        .insert("GREETING".into(), "hello 'quoted' world".into());

    let (tx, mut rx) = mpsc::channel(16);
    let exec = tokio::spawn({
        let sandbox = Arc::clone(&sandbox);
        async move { sandbox.exec(request, tx, CancellationToken::new()).await }
    });
    // "first" must arrive while the command still waits on the fifo.
    assert_eq!(first_stdout(&mut rx).await, "first\n");
    tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n").unwrap())
        .await
        .unwrap();
    let (mut stdout, mut stderr) = (String::from("first\n"), String::new());
    while let Some(chunk) = rx.recv().await {
        match chunk {
            ExecChunk::Stdout(d) => stdout.push_str(std::str::from_utf8(&d).unwrap()),
            ExecChunk::Stderr(d) => stderr.push_str(std::str::from_utf8(&d).unwrap()),
        }
    }
    let status = exec.await.unwrap().unwrap();
    assert_eq!(
        (status.exit_code, status.timed_out, status.cancelled),
        (Some(0), false, false)
    );
    let workdir = dir.path().to_str().unwrap();
    assert_eq!(
        stdout,
        format!("first\nhello 'quoted' world in {workdir}\n")
    );
    assert_eq!(stderr, "warn\n");

    let marker = marker_of(&fake, script);
    let Recorded::Exec { pod, query, argv } = fake
        .wait_for(|r| matches!(r, Recorded::Exec { argv, .. } if argv.last().unwrap() == script))
        .await
    else {
        unreachable!()
    };
    assert_eq!(pod, sandbox.id());
    assert_eq!(
        query
            .iter()
            .filter(|(k, _)| k != "command")
            .cloned()
            .collect::<Vec<_>>(),
        [
            ("stdout", "true"),
            ("stderr", "true"),
            ("container", "sandbox")
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    assert_eq!(
        argv[3..],
        [
            "conclave-exec".to_string(),
            workdir.into(),
            "2".into(),
            format!("CONCLAVE_EXEC={marker}"),
            "GREETING=hello 'quoted' world".into(),
            "/bin/sh".into(),
            "-c".into(),
            script.into()
        ]
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn exec_reports_nonzero_exit_codes() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (status, stdout, _) = run(&*sandbox, request(dir.path(), "echo partial; exit 3")).await;
    assert_eq!((status.exit_code, stdout.as_str()), (Some(3), "partial\n"));

    let mut missing = request(dir.path(), "");
    missing.command = vec!["conclave-no-such-command".into()];
    let (status, _, stderr) = run(&*sandbox, missing).await;
    assert_eq!(status.exit_code, Some(127), "{stderr}");

    let mut nowhere = request(dir.path(), "true");
    nowhere.workdir = dir.path().join("absent").to_str().unwrap().into();
    let (status, _, _) = run(&*sandbox, nowhere).await;
    assert_eq!(status.exit_code, Some(126));
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn exec_writes_stdin_then_closes_it() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cat = request(dir.path(), "cat; echo done");
    cat.stdin = Some(Bytes::from_static(b"line one\nline two\n").into());
    let (status, stdout, _) = run(&*sandbox, cat).await;
    assert_eq!(
        (status.exit_code, stdout.as_str()),
        (Some(0), "line one\nline two\ndone\n")
    );
    let asked_stdin = fake.recorded().iter().any(|r| {
        matches!(r, Recorded::Exec { query, .. } if query.contains(&("stdin".into(), "true".into())))
    });
    assert!(asked_stdin);
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn exec_timeout_kills_the_whole_process_tree() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // One child in the shell's group, one that left it with setsid.
    let script = "sleep 300 & setsid sleep 300 & echo started; wait";
    let mut request = request(dir.path(), script);
    request.timeout = Duration::from_secs(2);

    let (tx, mut rx) = mpsc::channel(16);
    let exec = tokio::spawn({
        let sandbox = Arc::clone(&sandbox);
        async move { sandbox.exec(request, tx, CancellationToken::new()).await }
    });
    assert_eq!(first_stdout(&mut rx).await, "started\n");
    let marker = marker_of(&fake, script);
    assert!(marked_processes(&marker).len() >= 2);

    let status = exec.await.unwrap().unwrap();
    assert_eq!(
        (status.exit_code, status.timed_out, status.cancelled),
        (None, true, false)
    );
    assert!(status.duration >= Duration::from_secs(2));
    assert!(kill_recorded(&fake, &marker));
    assert_eq!(marked_processes(&marker), Vec::<u32>::new());
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn exec_cancel_kills_the_process_tree_and_says_so() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = "sleep 300 & echo started; wait";
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel(16);
    let exec = tokio::spawn({
        let (sandbox, cancel) = (Arc::clone(&sandbox), cancel.clone());
        let request = request(dir.path(), script);
        async move { sandbox.exec(request, tx, cancel).await }
    });
    assert_eq!(first_stdout(&mut rx).await, "started\n");
    let marker = marker_of(&fake, script);
    assert!(!marked_processes(&marker).is_empty());

    cancel.cancel();
    let status = exec.await.unwrap().unwrap();
    assert_eq!(
        (status.exit_code, status.timed_out, status.cancelled),
        (None, false, true)
    );
    assert!(kill_recorded(&fake, &marker));
    assert_eq!(marked_processes(&marker), Vec::<u32>::new());
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn stats_reads_the_cgroup_counters() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let stats = sandbox.stats().await.unwrap();
    assert_eq!((stats.memory_bytes, stats.pids), (Some(1_048_576), Some(4)));
    assert!(stats.cpu_percent.is_some_and(|p| p >= 0.0), "{stats:?}");
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn list_managed_maps_session_and_pool_labels() {
    let (fake, backend) = setup().await;
    let for_session = backend.create(&spec()).await.unwrap();
    let mut pooled = spec();
    pooled.network = true;
    pooled.labels = BTreeMap::from([
        (LABEL_MANAGED.into(), "true".into()),
        (LABEL_INSTANCE.into(), "inst-1".into()),
        (LABEL_POOL.into(), "python".into()),
    ]);
    let in_pool = backend.create(&pooled).await.unwrap();
    fake.insert_pod("someone-elses", json!({"app": "web"}));

    let mut listed = backend.list_managed().await.unwrap();
    listed.sort_by(|a, b| a.id.cmp(&b.id));
    let mut expected = vec![
        ManagedSandbox {
            id: for_session.id().into(),
            instance: None,
            session: Some(SESSION.into()),
            pool: None,
            expires: None,
            created: None,
        },
        ManagedSandbox {
            id: in_pool.id().into(),
            instance: Some("inst-1".into()),
            session: None,
            pool: Some("python".into()),
            expires: None,
            created: None,
        },
    ];
    expected.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(listed, expected);
    let selector = Recorded::List {
        label_selector: "conclave.managed=true".into(),
    };
    assert!(fake.recorded().contains(&selector));
    let network_labels: Vec<_> = fake
        .recorded()
        .iter()
        .filter_map(|r| match r {
            Recorded::Create(pod) => Some(pod["metadata"]["labels"]["conclave.network"].clone()),
            _ => None,
        })
        .collect();
    assert_eq!(network_labels, [json!("none"), json!("allowed")]);
    assert_eq!(fake.violations(), Vec::<String>::new());
}

/// A warm-pool Pod claimed by a session is relabelled with a merge patch:
/// it gains the session's label and leaves the pool, so a restart's
/// listing reports it as the session's.
#[tokio::test]
async fn assign_relabels_a_pool_pod_as_the_sessions() {
    let (fake, backend) = setup().await;
    let mut pooled = spec();
    pooled.labels = BTreeMap::from([
        (LABEL_MANAGED.into(), "true".into()),
        (LABEL_INSTANCE.into(), "inst-1".into()),
        (LABEL_POOL.into(), "python".into()),
    ]);
    let sandbox = backend.create(&pooled).await.unwrap();

    sandbox.assign(SESSION).await.unwrap();

    let patch = fake.wait_for(|r| matches!(r, Recorded::Patch { .. })).await;
    assert_eq!(
        patch,
        Recorded::Patch {
            name: sandbox.id().into(),
            content_type: "application/merge-patch+json".into(),
            body: json!({"metadata": {"labels": {LABEL_SESSION: SESSION, LABEL_POOL: null}}}),
        }
    );
    assert_eq!(
        backend.list_managed().await.unwrap(),
        [ManagedSandbox {
            id: sandbox.id().into(),
            instance: Some("inst-1".into()),
            session: Some(SESSION.into()),
            pool: None,
            expires: None,
            created: None,
        }]
    );
    backend.remove(sandbox.id()).await.unwrap();
    let err = sandbox.assign(SESSION).await.unwrap_err();
    assert!(
        matches!(&err, SandboxError::Gone(id) if id == sandbox.id()),
        "{err:?}"
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn attach_finds_only_running_managed_pods() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let attached = backend.attach(sandbox.id()).await.unwrap().unwrap();
    assert_eq!(attached.id(), sandbox.id());
    assert!(
        backend
            .attach("conclave-sbx-000000000000")
            .await
            .unwrap()
            .is_none()
    );
    fake.insert_pod("someone-elses", json!({"app": "web"}));
    assert!(backend.attach("someone-elses").await.unwrap().is_none());
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn destroy_deletes_at_once_and_a_missing_pod_is_fine() {
    let (fake, backend) = setup().await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let name = sandbox.id().to_string();
    sandbox.destroy().await.unwrap();
    let deletes: Vec<_> = fake
        .recorded()
        .into_iter()
        .filter(|r| matches!(r, Recorded::Delete { .. }))
        .collect();
    assert_eq!(
        deletes,
        [Recorded::Delete {
            name: name.clone(),
            body: json!({"gracePeriodSeconds": 0})
        }]
    );
    assert_eq!(fake.pod_names(), Vec::<String>::new());
    backend.remove(&name).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = mpsc::channel(1);
    let gone = sandbox
        .exec(request(dir.path(), "true"), tx, CancellationToken::new())
        .await;
    assert!(
        matches!(&gone, Err(SandboxError::Gone(id)) if *id == name),
        "{gone:?}"
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn an_unpullable_image_fails_the_create_and_deletes_its_pod() {
    let (fake, backend) = setup().await;
    let mut bad = spec();
    bad.image = BAD_IMAGE.into();
    let result = backend.create(&bad).await;
    assert!(
        matches!(&result, Err(SandboxError::ImageNotFound(image)) if image == BAD_IMAGE),
        "{:?}",
        result.err()
    );
    let created = fake.recorded().iter().find_map(|r| match r {
        Recorded::Create(pod) => pod["metadata"]["name"].as_str().map(String::from),
        _ => None,
    });
    let name = created.unwrap();
    fake.wait_for(|r| matches!(r, Recorded::Delete { name: n, .. } if *n == name))
        .await;
    assert_eq!(fake.pod_names(), Vec::<String>::new());
    assert_eq!(fake.violations(), Vec::<String>::new());
}

/// A create given up while its Pod starts (the caller's future dropped: a
/// session's first call interrupted) still ends with the Pod deleted. A
/// create that finished before it could be given up is removed, and the
/// round is run again on a fresh fake.
#[tokio::test]
async fn an_abandoned_create_deletes_its_pod() {
    let mut abandoned = 0;
    for _ in 0..5 {
        let (fake, backend) = setup().await;
        let backend = Arc::new(backend);
        let creating = tokio::spawn({
            let backend = backend.clone();
            async move { backend.create(&spec()).await.map(|s| s.id().to_string()) }
        });
        let Recorded::Create(pod) = fake.wait_for(|r| matches!(r, Recorded::Create(_))).await
        else {
            unreachable!("wait_for matched a create");
        };
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        creating.abort();
        if let Ok(finished) = creating.await {
            backend.remove(&finished.unwrap()).await.unwrap();
            continue;
        }
        abandoned += 1;
        let deleted =
            fake.wait_for(|r| matches!(r, Recorded::Delete { name: n, .. } if *n == name));
        tokio::time::timeout(Duration::from_secs(30), deleted)
            .await
            .expect("an abandoned create left its Pod for 30 s");
        assert_eq!(fake.pod_names(), Vec::<String>::new());
        assert_eq!(fake.violations(), Vec::<String>::new());
    }
    assert!(
        abandoned > 0,
        "no create was slow enough to abandon in 5 tries"
    );
}
