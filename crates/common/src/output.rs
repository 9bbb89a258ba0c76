//! How a step's output bytes are shown as text (receipt tails, the API, `cairnctl`).
//! Output is bytes: NULs, invalid UTF-8, anything. Its text form keeps valid UTF-8 as
//! it is, except that a backslash is written `\\` and a NUL or any byte that is not
//! part of valid UTF-8 is written `\xNN`. The form round-trips ([`unescape`]), and
//! PostgreSQL text can hold it.

/// The text form of `bytes`.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\0' => out.push_str("\\x00"),
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
        assert_eq!(escape(b"plain\n"), "plain\n");
    }
}
