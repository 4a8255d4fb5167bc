//! Request parsing and validation on arbitrary input.
//!
//! Property: `RawRequest::from_json` then `Request::validate` never panic;
//! a request that validates obeys every documented range; every error is an
//! invalid-request error (exit status 2) that names the field at fault.
#![no_main]

use cmpl_core::error::CmplError;
use cmpl_core::request::{RawRequest, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let raw = match RawRequest::from_json(text, "the request") {
        Ok(raw) => raw,
        Err(e) => return check_error(&e, text),
    };
    match Request::validate(&raw) {
        Ok(req) => {
            check_request(&req, text);
            // Validation is a pure function of the fields.
            assert_eq!(Request::validate(&raw).ok().as_ref(), Some(&req));
        }
        Err(e) => check_error(&e, text),
    }
});

fn check_error(e: &CmplError, input: &str) {
    assert_eq!(
        e.kind.exit_code(),
        2,
        "not an invalid-request error for {input:?}: {e:?}"
    );
    assert!(
        e.param.is_some(),
        "error without param for {input:?}: {e:?}"
    );
    assert!(!e.message.is_empty(), "empty message for {input:?}");
    // The API's ErrorData must build for any error.
    let data = e.to_error_data();
    assert_eq!(data["error"]["param"].as_str(), e.param.as_deref());
}

fn check_request(r: &Request, input: &str) {
    let s = &r.sampling;
    let ctx = || format!("input {input:?} gave {r:?}");
    assert!((1..=128).contains(&r.n), "n: {}", ctx());
    assert!(r.logprobs.map_or(true, |k| k <= 20), "logprobs: {}", ctx());
    assert!(r.max_tokens >= 1, "max_tokens: {}", ctx());
    assert!(
        s.temperature.is_finite() && (0.0..=2.0).contains(&s.temperature),
        "temperature: {}",
        ctx()
    );
    assert!(
        s.top_p.is_finite() && (0.0..=1.0).contains(&s.top_p),
        "top_p: {}",
        ctx()
    );
    assert!(
        s.min_p.is_finite() && (0.0..=1.0).contains(&s.min_p),
        "min_p: {}",
        ctx()
    );
    assert!(s.top_k <= i32::MAX as u32, "top_k: {}", ctx());
    for (name, p) in [
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ] {
        assert!(
            p.is_finite() && (-2.0..=2.0).contains(&p),
            "{name}: {}",
            ctx()
        );
    }
    assert!(
        s.repetition_penalty.is_finite()
            && s.repetition_penalty > 0.0
            && s.repetition_penalty <= 10.0,
        "repetition_penalty: {}",
        ctx()
    );
    for &(id, bias) in &s.logit_bias {
        assert!(id >= 0, "logit_bias id: {}", ctx());
        assert!(
            bias.is_finite() && (-100.0..=100.0).contains(&bias),
            "logit_bias value: {}",
            ctx()
        );
    }
    assert!(!r.prompt.is_empty(), "prompt: {}", ctx());
    assert!(r.stop.iter().all(|s| !s.is_empty()), "stop: {}", ctx());
}
