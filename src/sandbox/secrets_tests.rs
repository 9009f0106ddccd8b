use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::*;

const TOKEN: &str = "tok-3xAmple/Secret+42";

fn scrubber() -> Scrubber {
    Scrubber::new([("TOKEN", TOKEN)]).unwrap()
}

#[test]
fn the_value_and_its_encoded_forms_are_replaced() {
    let s = scrubber();
    assert_eq!(s.scrub(&format!("x={TOKEN}\n")), "x=[secret TOKEN]\n");
    // `echo $TOKEN | base64`, and the value inside a longer encoded text
    // at each alignment.
    for prefix in ["", "a", "ab", "abc"] {
        let encoded = STANDARD.encode(format!("{prefix}{TOKEN}\n"));
        let out = s.scrub(&encoded);
        assert!(out.contains("[secret TOKEN]"), "{prefix:?}: {out}");
        let (head, tail) = out.split_once("[secret TOKEN]").unwrap();
        assert!(head.len() <= 4 && tail.len() <= 8, "{prefix:?}: {out}");
    }
    let url = percent_encoding::utf8_percent_encode(TOKEN, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    assert_eq!(s.scrub(&format!("?t={url}")), "?t=[secret TOKEN]");
    assert_eq!(
        s.scrub(&format!("?t={}", url.to_ascii_lowercase())),
        "?t=[secret TOKEN]"
    );
    // Python's print(os.environ) and a JSON text of it.
    let environ = format!("environ({{'TOKEN': '{TOKEN}', 'HOME': '/root'}})");
    assert_eq!(
        s.scrub(&environ),
        "environ({'TOKEN': '[secret TOKEN]', 'HOME': '/root'})"
    );
    let mut value = json!({"stdout": format!("{TOKEN}"), "list": [TOKEN], TOKEN: 1});
    s.scrub_value(&mut value);
    assert_eq!(
        value,
        json!({"stdout": "[secret TOKEN]", "list": ["[secret TOKEN]"], "[secret TOKEN]": 1})
    );
    assert!(!value.to_string().contains("Secret+42"));
}

#[test]
fn a_piece_at_a_cut_edge_is_replaced_only_where_there_is_a_cut() {
    let s = scrubber();
    let end = format!("output then {}", &TOKEN[..10]);
    assert_eq!(s.scrub(&end), end);
    assert_eq!(
        s.scrub_edges(&end, false, true),
        "output then [secret TOKEN]"
    );
    let start = format!("{} and on", &TOKEN[8..]);
    assert_eq!(s.scrub_edges(&start, true, false), "[secret TOKEN] and on");
    // Fewer bytes than a piece say nothing and stay.
    let short = format!("ends {}", &TOKEN[..3]);
    assert_eq!(s.scrub_edges(&short, true, true), short);
}

#[test]
fn a_stream_split_anywhere_never_shows_the_value() {
    let text = format!("before {TOKEN} between {TOKEN}{TOKEN} after\n");
    for split in 1..text.len() {
        let mut stream = StreamScrubber::new(scrubber());
        let mut out = stream.push(&text.as_bytes()[..split]);
        out.extend(stream.push(&text.as_bytes()[split..]));
        out.extend(stream.push(b"!"));
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("Secret"), "split at {split}: {out}");
        assert_eq!(
            out, "before [secret TOKEN] between [secret TOKEN][secret TOKEN] after\n!",
            "split at {split}"
        );
    }
    // One byte at a time.
    let mut stream = StreamScrubber::new(scrubber());
    let out: Vec<u8> = text.bytes().flat_map(|b| stream.push(&[b])).collect();
    assert!(!String::from_utf8(out).unwrap().contains("Secret"));
}

#[test]
fn no_secrets_changes_nothing() {
    let s = Scrubber::new([]).unwrap();
    assert!(s.is_empty());
    assert_eq!(s.scrub("anything"), "anything");
    let mut stream = StreamScrubber::new(s);
    assert_eq!(stream.push(b"abc"), b"abc");
}

#[test]
fn a_key_sees_its_own_secrets_and_everyones_not_another_keys() {
    let mut config = Config {
        secrets: [("SHARED".to_string(), "shared-value-1".to_string())]
            .into_iter()
            .collect(),
        ..Config::default()
    };
    config.keys.insert(
        "alice".into(),
        crate::config::NamedKey {
            key: "alice-key-1".into(),
            secrets: [("OWN".to_string(), "alice-value-1".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        },
    );
    let store = SecretStore::from_config(&config);
    let alice = key_owner("alice-key-1");
    let bob = key_owner("bob-key-12");
    assert_eq!(store.get(Some(&alice), "own"), Some("alice-value-1"));
    assert_eq!(store.get(Some(&alice), "SHARED"), Some("shared-value-1"));
    assert_eq!(store.get(Some(&bob), "OWN"), None);
    assert_eq!(store.get(None, "OWN"), None);
    assert_eq!(store.get(None, "shared"), Some("shared-value-1"));
}
