use super::*;
use serde_json::{Map, json};

fn connector() -> Definition {
    Definition::parse(CONNECTOR_YAML, "connector.yaml").unwrap()
}

fn counters(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn state(coverage: f64) -> Map<String, Value> {
    json!({"coverage_ratio": coverage})
        .as_object()
        .unwrap()
        .clone()
}

fn next(route: Route) -> (String, Option<String>) {
    match route {
        Route::Next { to, counter, .. } => (to, counter),
        other => panic!("expected a next node, got {other:?}"),
    }
}

#[test]
fn the_connector_routes_as_the_seed() {
    let d = connector();
    let none = counters(&[]);
    let full = state(1.0);
    assert_eq!(d.start, "research");
    assert_eq!(
        next(d.route("research", "DONE", &none, &full)).0,
        "generator"
    );
    assert_eq!(next(d.route("generator", "DONE", &none, &full)).0, "tester");
    assert_eq!(
        next(d.route("tester", "DONE", &none, &full)).0,
        "test_reviewer"
    );
    assert_eq!(
        next(d.route("test_reviewer", "INVALID", &none, &full)),
        ("tester".into(), Some("test_retries".into()))
    );
    assert_eq!(
        next(d.route("test_reviewer", "VALID_FAIL", &none, &full)),
        ("generator".into(), Some("gen_fix_retries".into()))
    );
    assert_eq!(
        next(d.route("test_reviewer", "VALID_PASS", &none, &full)).0,
        "reviewer"
    );
    assert_eq!(
        next(d.route("reviewer", "APPROVE", &none, &full)).0,
        "publisher"
    );
    assert_eq!(
        next(d.route("reviewer", "APPROVE", &none, &state(0.8))).0,
        "publisher"
    );
    assert_eq!(
        next(d.route("reviewer", "REJECT_CODE", &none, &full)),
        ("generator".into(), Some("review_retries".into()))
    );
    assert_eq!(
        next(d.route("reviewer", "REJECT_CONTEXT", &none, &full)),
        ("research".into(), Some("research_retries".into()))
    );
    assert_eq!(d.route("publisher", "PUBLISHED", &none, &full), Route::Done);
}

#[test]
fn every_limit_ends_the_run_failed_with_the_reason() {
    let d = connector();
    let full = state(1.0);
    for (node, decision, counter, limit) in [
        ("test_reviewer", "INVALID", "test_retries", 3),
        ("test_reviewer", "VALID_FAIL", "gen_fix_retries", 3),
        ("reviewer", "REJECT_CODE", "review_retries", 2),
    ] {
        let below = counters(&[(counter, limit - 1)]);
        assert!(matches!(
            d.route(node, decision, &below, &full),
            Route::Next { .. }
        ));
        let at = counters(&[(counter, limit)]);
        let Route::Fail(reason) = d.route(node, decision, &at, &full) else {
            panic!("{counter} at its limit must fail");
        };
        assert!(
            reason.contains(counter) && reason.contains(&limit.to_string()),
            "{reason}"
        );
    }
    // `research_retries <= max`: at the limit it is still allowed.
    let at = counters(&[("research_retries", 1)]);
    assert!(matches!(
        d.route("reviewer", "REJECT_CONTEXT", &at, &full),
        Route::Next { .. }
    ));
    let past = counters(&[("research_retries", 2)]);
    assert!(matches!(
        d.route("reviewer", "REJECT_CONTEXT", &past, &full),
        Route::Fail(_)
    ));
    // Approved below 80 % coverage: not published.
    let Route::Fail(reason) = d.route("reviewer", "APPROVE", &counters(&[]), &state(0.5)) else {
        panic!("low coverage must fail");
    };
    assert!(reason.contains("coverage_ratio"), "{reason}");
    assert!(matches!(
        d.route("reviewer", "MAYBE", &counters(&[]), &full),
        Route::Fail(_)
    ));
}

const SMALL: &str = "name: small
start: a
terminal: [c]
counters:
  again: 2
state:
  notes: {reducer: append}
nodes:
  a:
    prompt: go
    decisions: [OK, RETRY]
    writes: [notes]
  b:
    prompt: 'notes: {notes}'
  c:
    prompt: done
edges:
  - {from: a, when: OK, to: b}
  - {from: a, when: RETRY, to: a, counter: again}
  - {from: b, to: c}
";

#[test]
fn a_three_node_pipeline_loads() {
    let d = Definition::parse(SMALL, "small.yaml").unwrap();
    assert_eq!(d.nodes.len(), 3);
    assert_eq!(template_fields(&d.nodes["b"].prompt), ["notes"]);
}

/// Each mistake is refused with the file, the line and the place.
#[test]
fn each_validation_error_names_file_line_and_place() {
    let cases: [(&str, &str, &str, usize, &str); 11] = [
        ("start: a", "start: zz", "start", 2, "unknown node"),
        (
            "terminal: [c]",
            "terminal: [zz]",
            "terminal[0]",
            3,
            "unknown node",
        ),
        (
            "{from: b, to: c}",
            "{from: b, to: zz}",
            "edges[2].to",
            20,
            "unknown node",
        ),
        (
            "{from: a, when: OK, to: b}",
            "{from: a, when: NO, to: b}",
            "edges[0].when",
            18,
            "never answers",
        ),
        (
            "counter: again}",
            "counter: twice}",
            "edges[1].counter",
            19,
            "no limit",
        ),
        (
            "writes: [notes]",
            "writes: [notes, secret]",
            "nodes.a.writes",
            12,
            "no reducer",
        ),
        (
            "'notes: {notes}'",
            "'notes: {nope}'",
            "nodes.b.prompt",
            14,
            "not a state field",
        ),
        (
            "  - {from: a, when: RETRY, to: a, counter: again}\n",
            "",
            "nodes.a.decisions",
            11,
            "no edge leaves",
        ),
        (
            "  - {from: a, when: OK, to: b}\n",
            "  - {from: a, when: OK, to: c}\n",
            "nodes.b",
            13,
            "unreachable",
        ),
        (
            "notes: {reducer: append}",
            "notes: {reducer: keep_last}",
            "state.notes",
            7,
            "keep",
        ),
        (
            "  - {from: b, to: c}\n",
            "",
            "nodes.b",
            13,
            "no edge leaves",
        ),
    ];
    for (from, to, place, line, message) in cases {
        assert!(SMALL.contains(from), "{from}");
        let yaml = SMALL.replacen(from, to, 1);
        let err = Definition::parse(&yaml, "small.yaml").unwrap_err();
        assert_eq!(err.file, "small.yaml");
        assert_eq!(err.place, place, "{err}");
        assert_eq!(err.line, line, "{err}\n{yaml}");
        assert!(err.message.contains(message), "{err}");
    }
    let err = Definition::parse("name: x\nnodes: [\n", "broken.yaml").unwrap_err();
    assert_eq!(err.file, "broken.yaml");
    assert!(err.line > 0, "{err}");
    let err = Definition::parse(&SMALL.replace("start: a", "start: a\nbogus: 1"), "f").unwrap_err();
    assert!(err.message.contains("bogus"), "{err}");
}
