//! How a step's output bytes are shown as text (receipt tails, the API, `cairnctl`).
//! Output is bytes: NULs, invalid UTF-8, terminal escapes, anything. Its text form keeps
//! valid UTF-8 as it is, except that a backslash is written `\\`, and each byte of a
//! control character other than newline and tab (NUL, carriage return, escape, C1
//! controls) and each byte that is not part of valid UTF-8 is written `\xNN`. The form
//! round-trips ([`unescape`]), PostgreSQL text can hold it, and a terminal shows it as
//! text.

/// The text form of `bytes`.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' | '\t' => out.push(c),
                c if c.is_control() => {
                    let mut utf8 = [0u8; 4];
                    for b in c.encode_utf8(&mut utf8).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The bytes of a text form made by [`escape`]; `None` when it is not one.
pub fn unescape(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('\\') {
        out.extend_from_slice(&rest.as_bytes()[..i]);
        rest = &rest[i + 1..];
        if let Some(after) = rest.strip_prefix('\\') {
            out.push(b'\\');
            rest = after;
        } else {
            let hex = rest.strip_prefix('x')?.get(..2)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &rest[3..];
        }
    }
    out.extend_from_slice(rest.as_bytes());
    Some(out)
}

/// Where a request's live step output lives in an artifact store (every attempt, every
/// step): the worker writes under it, the API reads, the reaper deletes it whole.
pub fn live_request_prefix(request_id: uuid::Uuid) -> String {
    format!("outputs/{}/", request_id.simple())
}

/// The objects of one stream of one step's attempt (`stdout` or `stderr`), ending `/`.
pub fn live_stream_prefix(
    request_id: uuid::Uuid,
    epoch: i64,
    step_index: i64,
    stream: &str,
) -> String {
    format!(
        "{}{epoch}/{step_index}/{stream}/",
        live_request_prefix(request_id)
    )
}

/// The key of chunk `sequence` under a stream's prefix; zero-padded, so a store lists
/// chunks in order.
pub fn live_chunk_key(stream_prefix: &str, sequence: u64) -> String {
    format!("{stream_prefix}{sequence:010}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        let text = escape(&all);
        assert!(!text.contains('\0'));
        assert_eq!(unescape(&text), Some(all));
        let mixed = "naïve \\ path\0é".as_bytes().to_vec();
        assert_eq!(escape(&mixed), "naïve \\\\ path\\x00é");
        assert_eq!(unescape(&escape(&mixed)), Some(mixed));
        assert_eq!(escape(b"plain\n\tx"), "plain\n\tx");
        let terminal = "\x1b[31mred\r\u{85}".as_bytes().to_vec();
        assert_eq!(escape(&terminal), "\\x1b[31mred\\x0d\\xc2\\x85");
        assert_eq!(unescape(&escape(&terminal)), Some(terminal));
    }
}
