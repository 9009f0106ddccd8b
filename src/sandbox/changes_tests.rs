use super::*;

/// A snapshot-like tar of `files` (a target starting with `->` is a link).
fn tar_of(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> std::path::PathBuf {
    let mut builder = tar::Builder::new(Vec::new());
    let mut root = tar::Header::new_gnu();
    root.set_entry_type(tar::EntryType::Directory);
    root.set_size(0);
    root.set_mode(0o755);
    builder.append_data(&mut root, "./", &b""[..]).unwrap();
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        if let Some(target) = data.strip_prefix(b"->") {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder
                .append_link(
                    &mut header,
                    format!("./{path}"),
                    std::str::from_utf8(target).unwrap(),
                )
                .unwrap();
        } else {
            header.set_size(data.len() as u64);
            builder
                .append_data(&mut header, format!("./{path}"), *data)
                .unwrap();
        }
    }
    let path = dir.join(name);
    std::fs::write(&path, builder.into_inner().unwrap()).unwrap();
    path
}

#[test]
fn changes_list_added_modified_deleted_and_leave_out_git() {
    let dir = tempfile::tempdir().unwrap();
    let before = tar_of(
        dir.path(),
        "before.tar",
        &[
            ("a.txt", b"one\ntwo\n"),
            ("b.txt", b"gone\n"),
            ("same.txt", b"same\n"),
            ("link", b"->a.txt"),
            (".git/HEAD", b"ref: refs/heads/main\n"),
        ],
    );
    let after = tar_of(
        dir.path(),
        "after.tar",
        &[
            ("a.txt", b"one\nTWO\n"),
            ("same.txt", b"same\n"),
            ("c.bin", b"\x00\x01\x02"),
            ("link", b"->same.txt"),
            (".git/HEAD", b"ref: refs/heads/other\n"),
        ],
    );
    let found = changes(Some(&before), Some(&after)).unwrap();
    let listed: Vec<(&str, ChangeStatus, bool)> = found
        .iter()
        .map(|c| (c.path.as_str(), c.status, c.binary))
        .collect();
    assert_eq!(
        listed,
        [
            ("a.txt", ChangeStatus::Modified, false),
            ("b.txt", ChangeStatus::Deleted, false),
            ("c.bin", ChangeStatus::Added, true),
            ("link", ChangeStatus::Modified, false),
        ]
    );
    assert_eq!(found[0].bytes_before, Some(8));
    assert_eq!(found[2].bytes_after, Some(3));
    assert_eq!(
        ChangeCounts::of(&found),
        ChangeCounts {
            added: 1,
            modified: 2,
            deleted: 1
        }
    );

    let patch = patch(Some(&before), Some(&after), &found).unwrap();
    assert!(
        patch.contains("diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n"),
        "{patch}"
    );
    assert!(patch.contains("-two\n+TWO\n"), "{patch}");
    assert!(
        patch.contains("deleted file mode 100644\n--- a/b.txt\n+++ /dev/null\n"),
        "{patch}"
    );
    assert!(
        patch.contains("Binary files /dev/null and b/c.bin differ"),
        "{patch}"
    );
    assert!(!patch.contains(".git"), "{patch}");
}

#[test]
fn from_an_empty_workspace_everything_is_added() {
    let dir = tempfile::tempdir().unwrap();
    let after = tar_of(dir.path(), "after.tar", &[("x.py", b"print(1)\n")]);
    let found = changes(None, Some(&after)).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].status, ChangeStatus::Added);
    let patch = patch(None, Some(&after), &found).unwrap();
    assert!(
        patch.contains(
            "new file mode 100644\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+print(1)\n"
        ),
        "{patch}"
    );
}
