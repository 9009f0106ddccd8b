//! Run ids.

use super::*;

#[test]
fn run_ids_round_trip_and_others_are_not_found() {
    for since in [0, 1, 41, (1 << 56) - 1] {
        let id = run_id(since);
        assert_eq!(id.get_version_num(), 8);
        assert!(!id.is_nil());
        assert_eq!(run_since(&id.to_string()).ok(), Some(since));
    }
    assert!(run_since(&Uuid::nil().to_string()).is_err());
    assert!(run_since(&Uuid::new_v4().to_string()).is_err());
    assert!(run_since("not-a-uuid").is_err());
}
