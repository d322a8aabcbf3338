use super::*;

#[test]
fn causes_are_sources_not_text() {
    let io = std::io::Error::other("connection reset");
    let error = BrokerError::Unavailable(Cause::new("cannot fetch", io));
    assert_eq!(error.to_string(), "broker unavailable: cannot fetch");
    let source = std::error::Error::source(&error).unwrap();
    assert_eq!(source.to_string(), "connection reset");
    assert_eq!(
        error.with_causes().to_string(),
        "broker unavailable: cannot fetch: connection reset"
    );
    // An error that says it all is shown in place of a sentence, once.
    let io = std::io::Error::other("disk full");
    let error = BrokerError::Unavailable(Cause::from_error(io));
    assert_eq!(
        error.with_causes().to_string(),
        "broker unavailable: disk full"
    );
}

#[test]
fn reasons_are_bounded_on_a_character_boundary() {
    assert_eq!(bounded_reason("short"), "short");
    let exact = "x".repeat(MAX_REASON_BYTES);
    assert_eq!(bounded_reason(&exact), exact);
    // Three-byte characters never split, whatever the offset.
    for prefix in 0..3 {
        let long = format!("{}{}", "a".repeat(prefix), "€".repeat(MAX_REASON_BYTES));
        let bounded = bounded_reason(&long);
        assert!(bounded.len() <= MAX_REASON_BYTES, "{}", bounded.len());
        assert!(bounded.len() > MAX_REASON_BYTES - 8);
        assert!(bounded.ends_with('…'));
        assert!(long.starts_with(bounded.trim_end_matches('…')));
    }
}
