use super::*;

/// One entry with any name, link and type, as a hostile client writes it
/// (the tar crate's own setters refuse `..` and absolute paths).
fn raw(name: &str, kind: EntryType, link: &str, data: &[u8]) -> Vec<u8> {
    let mut header = Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_mtime(0);
    let old = header.as_old_mut();
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    out
}

fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0; 2 * BLOCK]);
    out
}

/// Feeds `data` in pieces of `piece` bytes; what passed, or the refusal.
fn check(data: &[u8], piece: usize, limit: u64) -> Result<(Vec<u8>, ArchiveCheck), Refusal> {
    let mut check = ArchiveCheck::new(limit, "sandbox.disk_mb");
    let mut passed = Vec::new();
    for chunk in data.chunks(piece) {
        let n = check.feed(chunk)?;
        passed.extend_from_slice(&chunk[..n]);
    }
    passed.extend_from_slice(check.finish()?);
    Ok((passed, check))
}

fn refused_entry(data: &[u8]) -> (String, String) {
    match check(data, 700, u64::MAX) {
        Err(Refusal::Entry { entry, why }) => (entry, why),
        other => panic!(
            "expected an entry refused, got {:?}",
            other.map(|(_, c)| c.files)
        ),
    }
}

#[test]
fn a_plain_archive_passes_whole_in_any_pieces() {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, "src/main.rs", &b"hello"[..])
        .unwrap();
    let mut dir = Header::new_gnu();
    dir.set_entry_type(EntryType::Directory);
    dir.set_size(0);
    builder
        .append_data(&mut dir, "src/empty", &b""[..])
        .unwrap();
    let mut link = Header::new_gnu();
    link.set_entry_type(EntryType::Symlink);
    link.set_size(0);
    builder
        .append_link(&mut link, "latest", "/etc/passwd")
        .unwrap();
    let long = format!("{}/file.txt", "d".repeat(150));
    let mut header = Header::new_gnu();
    header.set_size(3);
    builder
        .append_data(&mut header, &long, &b"abc"[..])
        .unwrap();
    let data = builder.into_inner().unwrap();
    for piece in [1, 7, 512, 4096, data.len()] {
        let (passed, check) = check(&data, piece, u64::MAX).unwrap();
        assert_eq!(&passed[..data.len()], &data[..], "piece {piece}");
        assert_eq!(check.files, 3);
        assert_eq!(check.bytes, 8);
    }
}

#[test]
fn absolute_paths_and_dot_dots_are_refused_naming_the_entry() {
    let (named, why) = refused_entry(&archive(&[raw(
        "/etc/cron.d/x",
        EntryType::Regular,
        "",
        b"x",
    )]));
    assert_eq!(named, "/etc/cron.d/x");
    assert!(why.contains("absolute"), "{why}");
    let (named, why) = refused_entry(&archive(&[
        raw("ok.txt", EntryType::Regular, "", b"x"),
        raw("a/../../x", EntryType::Regular, "", b"x"),
    ]));
    assert_eq!(named, "a/../../x");
    assert!(why.contains(".."), "{why}");
    let (named, why) = refused_entry(&archive(&[raw(
        "h",
        EntryType::Link,
        "../../etc/shadow",
        b"",
    )]));
    assert_eq!(named, "h");
    assert!(why.contains("hard link"), "{why}");
}

#[test]
fn an_entry_through_an_earlier_link_is_refused() {
    let (named, why) = refused_entry(&archive(&[
        raw("etc", EntryType::Symlink, "/etc", b""),
        raw(
            "./etc/passwd",
            EntryType::Regular,
            "",
            b"root::0:0::/:/bin/sh\n",
        ),
    ]));
    assert_eq!(named, "./etc/passwd");
    assert!(why.contains("symbolic link 'etc'"), "{why}");
    // A link to a file, then the file written through it.
    let (named, _) = refused_entry(&archive(&[
        raw("d/p", EntryType::Symlink, "/etc/passwd", b""),
        raw("d/p/x", EntryType::Regular, "", b"x"),
    ]));
    assert_eq!(named, "d/p/x");
}

#[test]
fn devices_fifos_and_unknown_types_are_refused() {
    for (kind, says) in [
        (EntryType::Char, "device"),
        (EntryType::Block, "device"),
        (EntryType::Fifo, "FIFO"),
        (EntryType::new(b'S'), "not unpacked"),
    ] {
        let (named, why) = refused_entry(&archive(&[raw("null", kind, "", b"")]));
        assert_eq!(named, "null");
        assert!(why.contains(says), "{kind:?}: {why}");
    }
}

#[test]
fn a_pax_path_is_checked_as_the_name() {
    let record = b"25 path=../../etc/passwd\n";
    let data = archive(&[
        raw("PaxHeaders/x", EntryType::XHeader, "", record),
        raw("harmless", EntryType::Regular, "", b"x"),
    ]);
    let (named, why) = refused_entry(&data);
    assert_eq!(named, "../../etc/passwd");
    assert!(why.contains(".."), "{why}");
}

#[test]
fn past_the_limit_is_too_large_and_names_the_setting() {
    let data = archive(&[raw("big", EntryType::Regular, "", &[7u8; 10_000])]);
    match check(&data, 4096, 8192) {
        Err(Refusal::TooLarge { limit, what }) => {
            assert_eq!(limit, 8192);
            assert_eq!(what, "sandbox.disk_mb");
        }
        other => panic!("{:?}", other.map(|(_, c)| c.files)),
    }
}

#[test]
fn nothing_after_the_end_blocks_is_passed_on() {
    let mut data = archive(&[raw("a", EntryType::Regular, "", b"x")]);
    let end = data.len() - BLOCK;
    data.extend_from_slice(&raw("/etc/evil", EntryType::Regular, "", b"x"));
    let (passed, _) = check(&data, 300, u64::MAX).unwrap();
    assert_eq!(passed.len(), end + BLOCK);
    assert!(passed[end..].iter().all(|b| *b == 0));
}

#[test]
fn garbage_cut_archives_and_empty_bodies_are_malformed() {
    assert!(matches!(
        check(&[b'x'; 1024], 100, u64::MAX),
        Err(Refusal::Malformed(_))
    ));
    assert!(matches!(
        check(b"", 100, u64::MAX),
        Err(Refusal::Malformed(_))
    ));
    let data = archive(&[raw("a", EntryType::Regular, "", &[1u8; 2000])]);
    assert!(matches!(
        check(&data[..1000], 100, u64::MAX),
        Err(Refusal::Malformed(_))
    ));
}
