//! The API key: where the server reads it, and how a request's is checked.

use crate::error::{CmplError, ErrorKind, Result};

/// Refuses a request without the server's key, where it has one.
pub fn check(headers: &hyper::HeaderMap, key: Option<&str>) -> Result<()> {
    let Some(key) = key else {
        return Ok(());
    };
    // OpenAI's clients send a bearer token, Anthropic's an `x-api-key`.
    let given = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), key.as_bytes()) {
        return Ok(());
    }
    Err(CmplError::new(
        ErrorKind::Auth,
        "missing or wrong API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
    ))
}

/// The key clients must send: `CMPL_API_KEY`, or the first line of the file
/// `CMPL_API_KEY_FILE` names.
pub fn api_key() -> Result<Option<String>> {
    if let Some(key) = std::env::var("CMPL_API_KEY")
        .ok()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
    {
        return Ok(Some(key));
    }
    let Some(file) = std::env::var_os("CMPL_API_KEY_FILE").filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&file).map_err(|e| {
        CmplError::invalid(
            "api_key",
            format!("CMPL_API_KEY_FILE {}: {e}", file.to_string_lossy()),
        )
    })?;
    let key = text.lines().next().unwrap_or("").trim().to_string();
    if key.is_empty() {
        return Err(CmplError::invalid(
            "api_key",
            format!("CMPL_API_KEY_FILE {} is empty", file.to_string_lossy()),
        ));
    }
    Ok(Some(key))
}

/// The token of an `Authorization: Bearer TOKEN` header; the scheme's
/// name is case-insensitive in HTTP (`bearer`, `BEARER`).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(char::is_whitespace)?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares without stopping at the first difference, so the time taken
/// says nothing about how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> hyper::HeaderMap {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(hyper::header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn the_key_is_a_bearer_token_its_scheme_in_any_case() {
        assert!(check(&hyper::HeaderMap::new(), None).is_ok());
        assert!(check(&with("Bearer sesame"), Some("sesame")).is_ok());
        assert!(check(&with("bearer  sesame "), Some("sesame")).is_ok());
        assert!(check(&with("BEARER sesame"), Some("sesame")).is_ok());
        for wrong in [
            "Bearer sesam",
            "Bearer sesamee",
            "Basic sesame",
            "sesame",
            "",
        ] {
            let e = check(&with(wrong), Some("sesame")).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Auth, "{wrong:?}");
        }
        assert!(check(&hyper::HeaderMap::new(), Some("sesame")).is_err());
    }

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }
}
