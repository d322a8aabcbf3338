//! A dead-letter copy that always fits the server's `max_payload`.

use super::*;

/// The headers and payload of a dead-letter copy that fits `max_payload`
/// (headers included, as the server counts): the reason bounded and on one
/// line, the original's sequence and size, the `message_id` the payload
/// carried (if any, read before any cut), and, if the whole payload would
/// not fit beside them, as much of it as does, marked as truncated. On a
/// server whose `max_payload` is smaller than the headers, the reason is cut
/// further. The copy carries `Nats-Msg-Id: dead-letter-{sequence}`, so that
/// JetStream keeps one copy however often the original is dead-lettered
/// within the stream's duplicate window (a redelivery after a settle that
/// was lost dead-letters it again).
pub(super) fn dead_letter_copy(
    payload: Bytes,
    reason: &str,
    sequence: u64,
    max_payload: usize,
) -> (HeaderMap, Bytes) {
    // Control characters cannot travel in a header value.
    let mut reason: String = bounded_reason(reason)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let message_id = crate::domain::salvage_message_id(&payload);
    let build = |reason: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("dead-letter-{sequence}").as_str(),
        );
        headers.insert(DEAD_LETTER_REASON_HEADER, reason);
        headers.insert(DEAD_LETTER_SEQUENCE_HEADER, sequence.to_string().as_str());
        headers.insert(DEAD_LETTER_SIZE_HEADER, payload.len().to_string().as_str());
        if let Some(id) = message_id {
            headers.insert(DEAD_LETTER_MESSAGE_ID_HEADER, id.to_string().as_str());
        }
        headers
    };
    let truncated_header = header_len(DEAD_LETTER_TRUNCATED_HEADER, "true");
    let mut headers = build(&reason);
    let over = (headers_len(&headers) + truncated_header).saturating_sub(max_payload);
    if over > 0 {
        let keep = reason.floor_char_boundary(reason.len().saturating_sub(over));
        reason.truncate(keep);
        headers = build(&reason);
    }
    let room = max_payload.saturating_sub(headers_len(&headers));
    if payload.len() <= room {
        return (headers, payload);
    }
    headers.insert(DEAD_LETTER_TRUNCATED_HEADER, "true");
    let payload = payload.slice(..room.saturating_sub(truncated_header));
    (headers, payload)
}

/// The size of a header block on the wire: `NATS/1.0\r\n`, a line per
/// value, and a blank line.
pub(super) fn headers_len(headers: &HeaderMap) -> usize {
    let lines: usize = headers
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |value| header_len(name.as_ref(), value.as_str()))
        })
        .sum();
    "NATS/1.0\r\n".len() + lines + "\r\n".len()
}

/// The size of one header line on the wire: `name: value\r\n`.
pub(super) fn header_len(name: &str, value: &str) -> usize {
    name.len() + ": ".len() + value.len() + "\r\n".len()
}
