//! Flag values clap cannot parse alone: durations and listen addresses.

use crate::error::{CmplError, Result};
use crate::options::Listen;
use std::path::PathBuf;
use std::time::Duration;

/// A size in bytes as `--queue-memory` takes it: `65536`, `64K`, `256M`, `2G`.
pub fn byte_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => {
            return Err(format!(
                "`{text}` is not a size: give bytes, or a number with K, M or G (256M)"
            ))
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!("`{text}` is not a size: give bytes, or a number with K, M or G (256M)")
        })
}

/// A duration as `--keep-alive` takes it: `30s`, `5m`, `1h`, or seconds.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => 0,
    };
    match digits.parse::<u64>() {
        Ok(n) if scale > 0 && n.saturating_mul(scale) <= 7 * 86400 => {
            Ok(Duration::from_secs(n * scale))
        }
        Ok(_) if scale > 0 => Err(format!("{text:?} is over a week; give at most 168h")),
        _ => Err(format!(
            "{text:?} is not a duration; give 30s, 5m, 1h, or 0 to turn it off"
        )),
    }
}

/// An `--rpc` server, as llama.cpp's RPC client reads it.
pub fn rpc_endpoint(text: &str) -> std::result::Result<String, String> {
    crate::engine::rpc::parse_endpoint(text.trim())?;
    Ok(text.trim().to_string())
}

/// `--serve`'s address: `host:port`, `:port`, a bare port (on 127.0.0.1),
/// or `unix:PATH`.
pub fn serve_addr(text: &str) -> Result<Listen> {
    if let Some(path) = text.strip_prefix("unix:") {
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    let text = text.trim();
    let full = match text.parse::<u16>() {
        Ok(port) => format!("127.0.0.1:{port}"),
        Err(_) if text.starts_with(':') => format!("127.0.0.1{text}"),
        Err(_) => text.to_string(),
    };
    full.parse().map(Listen::Tcp).map_err(|_| {
        CmplError::invalid(
            "serve",
            format!(
                "--serve {text:?} is not an address; give host:port (127.0.0.1:8337), a port, or unix:PATH"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_seconds_minutes_or_hours_up_to_a_week() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration(" 5m "), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("169h").unwrap_err().contains("over a week"));
        assert!(parse_duration("5d").unwrap_err().contains("not a duration"));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn sizes_in_bytes_or_with_a_unit() {
        assert_eq!(byte_size("65536"), Ok(65536));
        assert_eq!(byte_size("64K"), Ok(64 << 10));
        assert_eq!(byte_size("256m"), Ok(256 << 20));
        assert_eq!(byte_size("2GiB"), Ok(2 << 30));
        for bad in ["", "0", "12X", "M", "-1", "99999999999999999999G"] {
            assert!(byte_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn addresses_default_to_this_machine() {
        let tcp = |s: &str| match serve_addr(s).unwrap() {
            Listen::Tcp(a) => a.to_string(),
            Listen::Unix(p) => panic!("{p:?}"),
        };
        assert_eq!(tcp("8080"), "127.0.0.1:8080");
        assert_eq!(tcp(":9"), "127.0.0.1:9");
        assert_eq!(tcp("0.0.0.0:1"), "0.0.0.0:1");
        assert_eq!(
            serve_addr("unix:/tmp/s").unwrap(),
            Listen::Unix("/tmp/s".into())
        );
        let e = serve_addr("localhost").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("serve"));
    }
}
