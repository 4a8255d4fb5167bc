//! URLs of servers cmpl sends keys to, read by a real parser (the `http`
//! crate's, which ureq sends with): the host a key goes to is the host the
//! connection goes to, never a guess from splitting the string.

use ureq::http::Uri;

/// Where a URL leads: what a key is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `http` or `https`, lower case.
    pub scheme: String,
    /// Lower case; an IPv6 address in brackets.
    pub host: String,
    /// The port given, else the scheme's.
    pub port: u16,
}

impl Origin {
    /// The origin of an absolute `http://` or `https://` URL. A URL with user
    /// information (`user:pass@host`) is refused: it hides where a request goes.
    pub fn parse(url: &str) -> Result<Origin, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
        let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
        let default_port = match scheme.as_deref() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err(format!("{url:?} is not an http:// or https:// URL")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url:?} names no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "{url:?} carries user information before `@`; give the server's URL alone"
            ));
        }
        if authority.host().is_empty() {
            return Err(format!("{url:?} names no host"));
        }
        Ok(Origin {
            scheme: scheme.unwrap_or_default(),
            host: authority.host().to_ascii_lowercase(),
            port: uri.port_u16().unwrap_or(default_port),
        })
    }

    /// `127.0.0.0/8`, `::1` or `localhost`: traffic that never leaves the machine.
    pub fn is_loopback(&self) -> bool {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_where_the_connection_goes() {
        let o = Origin::parse("HTTPS://API.OpenAI.com/v1").unwrap();
        assert_eq!(
            (o.scheme.as_str(), o.host.as_str(), o.port),
            ("https", "api.openai.com", 443)
        );
        let o = Origin::parse("http://127.0.0.1:8080/v1").unwrap();
        assert_eq!((o.host.as_str(), o.port), ("127.0.0.1", 8080));
        assert!(o.is_loopback());
        assert!(Origin::parse("http://[::1]:9/v1").unwrap().is_loopback());
        assert!(!Origin::parse("http://10.0.0.2/v1").unwrap().is_loopback());
        for bad in [
            "http://api.openai.com:80@127.0.0.1:18771/v1",
            "https://user:pw@api.together.xyz/v1",
            "ftp://example.com/",
            "api.openai.com/v1",
            "http:///v1",
            "http://exa mple.com/",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
    }
}
