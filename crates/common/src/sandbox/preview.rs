//! What the scheduler and the hosting worker agree on for previews: the headers of the
//! hop between them, and which headers never cross a hop.

use axum::http::{header, HeaderMap};

/// On a refusal of Cairn's own (the scheduler's or the worker's), with its code: it
/// tells a refusal from the sandbox's answer, whose statuses and bodies are its own.
pub const REFUSED_HEADER: &str = "cairn-preview-refused";
/// The sandbox's path and query, from the scheduler to the worker (never in the
/// worker's URL, which a path's dot segments could lead elsewhere in).
pub const PATH_HEADER: &str = "cairn-preview-path";

/// Headers that belong to one connection (RFC 9110, 7.6.1), and Cairn's own, which a
/// caller or a sandbox may not set.
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    REFUSED_HEADER,
    PATH_HEADER,
];

/// Removes what never crosses a hop: [`NOT_FORWARDED`] and the headers `Connection`
/// names.
pub fn strip_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in NOT_FORWARDED
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hop_keeps_only_end_to_end_headers() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "5"),
            (REFUSED_HEADER, "not_hosted"),
            (PATH_HEADER, "/elsewhere"),
            ("content-type", "text/plain"),
        ] {
            headers.insert(name, value.parse().expect("value"));
        }
        strip_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type"]);
    }
}
