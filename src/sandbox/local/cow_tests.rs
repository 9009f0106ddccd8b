//! Layered workspaces (`cow`): a freeze makes a layer and a fresh upper
//! layer, a seeded sandbox of another uid changes files of layers it
//! shares without touching them, links stay links, the disk limit holds
//! over the layers, and removing a sandbox leaves its layers. They need
//! root and overlayfs (as CI runs them) and fail without.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::tests::{Fixture, SHORT, fixture, sh, spec, uid_of};
use crate::sandbox::{Sandbox, SandboxBackend, SandboxSpec, layers};

fn store(f: &Fixture) -> PathBuf {
    f.root.with_file_name("layers")
}

/// A fixture whose sandboxes are layered: these tests fail, not pass
/// empty, where they cannot be.
fn layered_fixture() -> Fixture {
    let f = fixture();
    assert!(
        f.backend.host.layered,
        "layered workspaces need root and overlayfs; the tests run as root"
    );
    f
}

async fn freeze(sandbox: &dyn Sandbox, store: &Path) -> Vec<PathBuf> {
    sandbox
        .freeze(store)
        .await
        .expect("freeze")
        .expect("a layered workspace")
}

#[tokio::test]
async fn a_freeze_makes_a_layer_that_a_fork_of_another_uid_changes_apart() {
    let f = layered_fixture();
    let source = f.backend.create(&spec()).await.expect("create");
    let (status, _, err) = sh(
        &*source,
        "mkdir d && echo one > d/f && echo keep > k && chmod 600 k",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    let chain = freeze(&*source, &store(&f)).await;
    assert_eq!(chain.len(), 1);
    assert_eq!(
        fs::read_to_string(chain[0].join("d/f")).unwrap(),
        "one\n",
        "the layer holds the turn's files"
    );
    // Nothing changed since: the same chain, no new layer.
    assert_eq!(freeze(&*source, &store(&f)).await, chain);
    // The source goes on above its layer.
    let (_, out, _) = sh(&*source, "echo two > d/f && cat d/f k", SHORT).await;
    assert_eq!(out, "two\nkeep\n");

    let fork = f.backend.create(&spec()).await.expect("create");
    assert_ne!(uid_of(&*fork).await, uid_of(&*source).await);
    assert!(fork.seed(&chain).await.expect("seed"));
    let (status, out, err) = sh(
        &*fork,
        "cat d/f k && echo mine > d/f && rm k && echo new > n && ls -a . d && stat -c %U d/f",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    assert!(out.starts_with("one\nkeep\n"), "{out}");
    assert!(!out.contains("\nk\n"), "{out}");
    assert!(out.trim_end().ends_with("sandbox"), "its own files: {out}");
    // The source and the layer saw none of it.
    let (_, out, _) = sh(&*source, "cat d/f k; ls", SHORT).await;
    assert_eq!(out, "two\nkeep\nd\nk\n");
    assert_eq!(fs::read_to_string(chain[0].join("d/f")).unwrap(), "one\n");
    assert!(chain[0].join("k").exists());

    // The fork's own freeze tops the shared layer with its changes,
    // the deletion included.
    let forked = freeze(&*fork, &store(&f)).await;
    assert_eq!(forked.len(), 2);
    assert_eq!(forked[1], chain[0]);
    let sibling = f.backend.create(&spec()).await.expect("create");
    assert!(sibling.seed(&forked).await.expect("seed"));
    let (_, out, _) = sh(&*sibling, "cat d/f n; ls", SHORT).await;
    assert_eq!(out, "mine\nnew\nd\nn\n");

    for sandbox in [fork, sibling, source] {
        sandbox.destroy().await.expect("destroy");
    }
    // Removing the sandboxes never reached into the layers.
    assert_eq!(fs::read_to_string(chain[0].join("d/f")).unwrap(), "one\n");
    assert!(forked[0].join("n").exists());
}

#[tokio::test]
async fn a_link_to_a_host_path_stays_a_link_in_layers_and_tars() {
    let f = layered_fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (status, _, err) = sh(
        &*sandbox,
        "ln -s /etc/hostname host && ln -s / root && mkdir sub && ln -s ../../.. sub/up",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    let chain = freeze(&*sandbox, &store(&f)).await;
    for link in ["host", "root", "sub/up"] {
        let meta = fs::symlink_metadata(chain[0].join(link)).unwrap();
        assert!(meta.file_type().is_symlink(), "{link} was copied as a link");
    }
    let tar = f.root.with_file_name("chain.tar");
    layers::tar_chain(&chain, &tar).expect("tar");
    let listing = std::process::Command::new("tar")
        .arg("-tvf")
        .arg(&tar)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("./host -> /etc/hostname"), "{listing}");
    assert!(listing.contains("./root -> /"), "{listing}");
    assert!(
        !listing.contains("./root/"),
        "nothing through the link: {listing}"
    );
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn the_disk_limit_holds_over_the_layers() {
    let f = layered_fixture();
    let sandbox = f
        .backend
        .create(&SandboxSpec {
            disk_mb: 8,
            ..spec()
        })
        .await
        .expect("create");
    let (status, _, err) = sh(&*sandbox, "head -c 5M /dev/zero > a", SHORT).await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    freeze(&*sandbox, &store(&f)).await;
    // The same mount goes on: 3 MB of the limit left.
    let (status, _, err) = sh(&*sandbox, "head -c 5M /dev/zero > b", SHORT).await;
    assert_ne!(status.exit_code, Some(0));
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        err.contains("conclave: /workspace is full") && err.contains("8 MB"),
        "{err}"
    );
    // Room comes back with the files that take it.
    let (status, _, err) = sh(&*sandbox, "rm b && head -c 2M /dev/zero > c", SHORT).await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_chain_past_its_bound_is_merged() {
    let f = layered_fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let mut chain = Vec::new();
    for turn in 0..=layers::MAX_LAYERS {
        let gone = if turn > 0 { "rm -f t0" } else { "true" };
        sh(
            &*sandbox,
            &format!("echo {turn} > t{turn} && {gone}"),
            SHORT,
        )
        .await;
        chain = freeze(&*sandbox, &store(&f)).await;
    }
    assert_eq!(chain.len(), 1, "merged into one layer");
    // By hard links: t1 is the file of the first layer that held it;
    // t0 is a whiteout (it hides what a lower layer might hold).
    let files: Vec<String> = fs::read_dir(&chain[0])
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), layers::MAX_LAYERS, "t1..t16, no t0: {files:?}");
    assert!(!files.contains(&"t0".to_string()));
    assert!(
        fs::metadata(chain[0].join("t1")).unwrap().nlink() > 1,
        "a hard link"
    );
    let (_, out, _) = sh(&*sandbox, "cat t16; ls | wc -l", SHORT).await;
    assert_eq!(out, format!("16\n{}\n", layers::MAX_LAYERS));
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_freeze_keeps_renames_replacements_and_deletions() {
    let f = layered_fixture();
    let source = f.backend.create(&spec()).await.expect("create");
    let (status, _, err) = sh(
        &*source,
        "mkdir -p a/b && echo 1 > a/b/f && mkdir c && echo 2 > c/g && echo 3 > h && echo 4 > gone",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    let first = freeze(&*source, &store(&f)).await;
    let (status, _, err) = sh(
        &*source,
        "mv a z && rm -rf c && mkdir c && echo 5 > c/new && rm h && mkdir h && echo 6 > h/in \
         && rm gone && chmod 700 z",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    let second = freeze(&*source, &store(&f)).await;
    assert_eq!(second.len(), 2);
    let listing = "find . | sort && cat z/b/f c/new h/in && stat -c %a z";
    let (_, live, _) = sh(&*source, listing, SHORT).await;
    for (chain, expected) in [
        (&second, live.as_str()),
        (
            &first,
            ".\n./a\n./a/b\n./a/b/f\n./c\n./c/g\n./gone\n./h\n1\n",
        ),
    ] {
        let fork = f.backend.create(&spec()).await.expect("create");
        assert!(fork.seed(chain).await.expect("seed"));
        let script = if chain.len() == 1 {
            "find . | sort && cat a/b/f"
        } else {
            listing
        };
        let (_, out, err) = sh(&*fork, script, SHORT).await;
        assert_eq!(out, expected, "{err}");
        fork.destroy().await.expect("destroy");
    }
    assert_eq!(
        live,
        ".\n./c\n./c/new\n./h\n./h/in\n./z\n./z/b\n./z/b/f\n1\n5\n6\n700\n"
    );
    source.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_merged_chain_of_a_forks_is_its_own() {
    let f = layered_fixture();
    let source = f.backend.create(&spec()).await.expect("create");
    sh(&*source, "echo from-source > orig", SHORT).await;
    let first = freeze(&*source, &store(&f)).await;
    let fork = f.backend.create(&spec()).await.expect("create");
    assert!(fork.seed(&first).await.expect("seed"));
    let mut chain = first.clone();
    for turn in 0..layers::MAX_LAYERS {
        sh(&*fork, &format!("echo {turn} > n{turn}"), SHORT).await;
        chain = freeze(&*fork, &store(&f)).await;
    }
    assert_eq!(chain.len(), 1, "merged, the source's layer with it");
    // A third uid changes the file the source made, through the merged
    // layer's one owner.
    let third = f.backend.create(&spec()).await.expect("create");
    assert!(third.seed(&chain).await.expect("seed"));
    let (status, out, err) = sh(&*third, "echo more >> orig && cat orig n15", SHORT).await;
    assert_eq!(status.exit_code, Some(0), "{err}");
    assert_eq!(out, "from-source\nmore\n15\n");
    // The source's layer is as it was.
    assert_eq!(
        fs::read_to_string(first[0].join("orig")).unwrap(),
        "from-source\n"
    );
    for sandbox in [third, fork, source] {
        sandbox.destroy().await.expect("destroy");
    }
}
