//! llama.cpp's RPC backend: `rpc-server`s, on other machines or this one,
//! added as devices, over which llama.cpp spreads a model's layers as it
//! does over GPUs (RPC devices first, to keep transfers few). The protocol
//! has no authentication and no encryption (docs/remote.md).

use cmpl_core::error::{CmplError, ErrorKind, Result};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, CStr, CString};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

/// How long a server may take to accept a connection before it is called
/// unreachable: llama.cpp's own connect waits for the system's timeout
/// (minutes), then aborts the process.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A `HOST:PORT` as llama.cpp's RPC client reads it (IPv4 or a name, split
/// at the first colon), checked so that llama.cpp, which aborts on a bad
/// endpoint, never sees one.
pub fn parse_endpoint(endpoint: &str) -> std::result::Result<(&str, u16), String> {
    let (host, port) = endpoint.split_once(':').ok_or_else(|| {
        format!("{endpoint:?} is not HOST:PORT (as ggml-rpc-server -H HOST -p PORT listens)")
    })?;
    if host.is_empty() || host.starts_with('[') || port.contains(':') {
        return Err(format!(
            "{endpoint:?} is not HOST:PORT with an IPv4 address or a host name (llama.cpp's RPC client speaks IPv4 only)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host, p)),
        _ => Err(format!(
            "{endpoint:?}: the port must be a number from 1 to 65535"
        )),
    }
}

/// Whether every address `endpoint` names is this machine's loopback.
pub fn is_loopback(endpoint: &str) -> bool {
    ipv4_addrs(endpoint).is_ok_and(|a| !a.is_empty() && a.iter().all(|a| a.ip().is_loopback()))
}

fn ipv4_addrs(endpoint: &str) -> std::io::Result<Vec<SocketAddr>> {
    Ok(endpoint
        .to_socket_addrs()?
        .filter(SocketAddr::is_ipv4)
        .collect())
}

fn unavailable(message: String) -> CmplError {
    CmplError::new(ErrorKind::Unavailable, message).with_param("rpc")
}

/// Connects to each server once, with a timeout, so that one that is down
/// or not there is an error that names it (llama.cpp would abort).
fn probe(endpoint: &str) -> Result<()> {
    let addrs = ipv4_addrs(endpoint)
        .map_err(|e| unavailable(format!("--rpc {endpoint}: cannot resolve the host ({e})")))?;
    let addr = addrs.first().ok_or_else(|| {
        unavailable(format!("--rpc {endpoint}: the host has no IPv4 address (llama.cpp's RPC client speaks IPv4 only)"))
    })?;
    TcpStream::connect_timeout(addr, CONNECT_TIMEOUT).map_err(|e| {
        unavailable(format!(
            "--rpc {endpoint}: cannot connect ({e}); start `ggml-rpc-server -H {} -p {}` there, or drop it from --rpc",
            addr.ip(),
            addr.port()
        ))
    })?;
    Ok(())
}

/// llama.cpp aborts the process where an RPC server goes away mid-run or
/// answers in another protocol version: say so as cmpl's errors are said,
/// with what was printed so far flushed (`exit` flushes stdout), and the
/// exit code of an engine that became unavailable.
extern "C" fn on_abort(message: *const c_char) {
    let text = if message.is_null() {
        String::new()
    } else {
        // SAFETY: ggml passes a NUL-terminated message.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .trim()
            .to_string()
    };
    eprintln!(
        "cmpl: error: llama.cpp stopped: {text} (an --rpc server went away, or runs another llama.cpp version: restart it and run again)"
    );
    std::process::exit(ErrorKind::Unavailable.exit_code());
}

/// The servers already added to llama.cpp's devices in this process (a
/// resident or server loads once; adding one twice would add its devices
/// twice).
static ADDED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Adds each `HOST:PORT` running `rpc-server` to llama.cpp's devices, so
/// the next model loaded spreads its layers over them. A host that is not
/// loopback is used with a warning, as `CMPL_API_KEY` over plain http is.
pub fn add_servers(endpoints: &[String]) -> Result<()> {
    if endpoints.is_empty() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated name; the registry lives for the process.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
    if reg.is_null() {
        return Err(CmplError::invalid(
            "rpc",
            "this cmpl was built without llama.cpp's RPC backend; build it with GGML_RPC=ON (as .cargo/config.toml sets) or drop --rpc",
        ));
    }
    // SAFETY: as above; the function is the RPC registry's own.
    let add = unsafe {
        sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_rpc_add_server".as_ptr())
    };
    if add.is_null() {
        return Err(CmplError::invalid(
            "rpc",
            "llama.cpp's RPC backend in this build has no ggml_backend_rpc_add_server",
        ));
    }
    type AddServer = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;
    // SAFETY: ggml-rpc.h declares it so: `ggml_backend_reg_t (const char *)`.
    let add: AddServer = unsafe { std::mem::transmute::<*mut std::ffi::c_void, AddServer>(add) };
    let mut added = ADDED.lock().unwrap_or_else(|e| e.into_inner());
    for endpoint in endpoints {
        if added.contains(endpoint) {
            continue;
        }
        parse_endpoint(endpoint).map_err(|e| CmplError::invalid("rpc", e))?;
        probe(endpoint)?;
        if !is_loopback(endpoint) {
            eprintln!(
                "cmpl: warning: --rpc {endpoint} is another machine, and llama.cpp's RPC has no authentication or encryption: the weights, prompts and answers cross the network readable, and anyone who can reach that port can use it; keep it on a network you trust"
            );
        }
        // SAFETY: sets a process-wide function pointer; `on_abort` never returns.
        unsafe { sys::ggml_set_abort_callback(Some(on_abort)) };
        let c = CString::new(endpoint.as_str())
            .map_err(|_| CmplError::invalid("rpc", format!("{endpoint:?} holds a NUL byte")))?;
        // SAFETY: a NUL-terminated endpoint llama.cpp copies; it connects
        // (checked reachable above) and asks the server for its devices.
        let server = unsafe { add(c.as_ptr()) };
        if server.is_null() {
            return Err(unavailable(format!(
                "--rpc {endpoint}: the server offers no device; start ggml-rpc-server there with one (-d)"
            )));
        }
        // SAFETY: a registry llama.cpp made for this server, kept for the process.
        unsafe { sys::ggml_backend_register(server) };
        added.push(endpoint.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_as_llama_cpp_reads_them() {
        assert_eq!(parse_endpoint("127.0.0.1:50052"), Ok(("127.0.0.1", 50052)));
        assert_eq!(parse_endpoint("gpu-box:1"), Ok(("gpu-box", 1)));
        for bad in [
            "127.0.0.1",
            ":50052",
            "h:0",
            "h:65536",
            "h:x",
            "[::1]:50052",
            "::1:5",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
        assert!(is_loopback("127.0.0.1:1"));
        assert!(is_loopback("localhost:1"));
        assert!(!is_loopback("10.1.2.3:1"));
    }
}
