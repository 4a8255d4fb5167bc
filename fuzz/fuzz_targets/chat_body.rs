//! The chat endpoint's body parser on arbitrary input.
//!
//! Property: `chat_body::request` (the server's `/v1/chat/completions`
//! parser) then `Request::validate` never panic; every error is an
//! invalid-request error (exit status 2) that names the field at fault,
//! with a message, and builds its `ErrorData`; the request the body maps to
//! keeps `messages` and reports `stream_options.include_usage`; a request
//! that validates is a chat whose conversation obeys the bounds of
//! src/request.rs (at most `MAX_MESSAGES` turns of `MAX_CONVERSATION_BYTES`
//! in all, none with a NUL, roles system/user/assistant, contents of at
//! most `MAX_PARTS` text parts and `MAX_ALL_PARTS` in all, names of at most
//! `MAX_NAME_BYTES`), whose turns are the body's own (a string content, or
//! its text parts joined), and whose other fields obey their ranges; and
//! validating it again gives the same request.
#![no_main]

use cmpl_core::chat_body;
use cmpl_core::error::CmplError;
use cmpl_core::request::{
    RawRequest, Request, MAX_ALL_PARTS, MAX_CONVERSATION_BYTES, MAX_MESSAGES, MAX_NAME_BYTES,
    MAX_PARTS, MAX_TEMPLATE_BYTES,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (raw, usage) = match chat_body::request(text) {
        Ok(parsed) => parsed,
        Err(e) => return check_error(&e, text),
    };
    check_raw(&raw, usage, text);
    match Request::validate(&raw) {
        Ok(req) => {
            check_request(&req, &raw, text);
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
    assert_eq!(
        data["error"]["type"].as_str(),
        Some("invalid_request_error")
    );
}

/// The completions request a body maps to: `messages` present, no
/// `prompt`, the usage flag as `stream_options` asks.
fn check_raw(raw: &RawRequest, usage: bool, input: &str) {
    let ctx = || format!("input {input:?} gave {raw:?}");
    assert!(raw.get("messages").is_some(), "no messages: {}", ctx());
    assert!(raw.fields.get("prompt").is_none(), "a prompt: {}", ctx());
    for key in [
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "parallel_tool_calls",
        "top_logprobs",
        "max_completion_tokens",
    ] {
        assert!(!raw.fields.contains_key(key), "{key} kept: {}", ctx());
    }
    let asked = raw
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    assert_eq!(usage, asked, "include_usage: {}", ctx());
}

fn check_request(r: &Request, raw: &RawRequest, input: &str) {
    let ctx = || format!("input {input:?} gave {r:?}");
    assert!(r.prompt.is_empty(), "a chat's prompt: {}", ctx());
    let chat = r
        .chat
        .as_ref()
        .unwrap_or_else(|| panic!("no chat: {}", ctx()));
    if let Some(t) = &chat.template {
        assert!(t.len() <= MAX_TEMPLATE_BYTES, "template bytes: {}", ctx());
    }

    // The conversation and its bounds.
    let turns = &chat.messages;
    assert!(
        !turns.is_empty() && turns.len() <= MAX_MESSAGES,
        "{} messages: {}",
        turns.len(),
        ctx()
    );
    let bytes: usize = turns.iter().map(|m| m.content.len()).sum();
    assert!(bytes <= MAX_CONVERSATION_BYTES, "{bytes} bytes: {}", ctx());
    for m in turns {
        assert!(!m.content.contains('\0'), "a NUL: {}", ctx());
        assert!(
            matches!(m.role.as_str(), "system" | "user" | "assistant"),
            "role {:?}: {}",
            m.role,
            ctx()
        );
    }

    // The turns are the body's own: as many, each its role and its text.
    let given = raw
        .get("messages")
        .and_then(|v| v.as_array())
        .unwrap_or_else(|| panic!("messages not a list: {}", ctx()));
    assert_eq!(given.len(), turns.len(), "turns: {}", ctx());
    let mut all_parts = 0;
    for (m, turn) in given.iter().zip(turns) {
        let role = m["role"]
            .as_str()
            .unwrap_or_else(|| panic!("role: {}", ctx()));
        let role = if role == "developer" { "system" } else { role };
        assert_eq!(role, turn.role, "role: {}", ctx());
        let text = match &m["content"] {
            c if c.is_string() => c.as_str().unwrap_or_default().to_string(),
            c => {
                let parts = c
                    .as_array()
                    .unwrap_or_else(|| panic!("content neither text nor parts: {}", ctx()));
                assert!(parts.len() <= MAX_PARTS, "{} parts: {}", parts.len(), ctx());
                all_parts += parts.len();
                parts
                    .iter()
                    .map(|p| {
                        assert_eq!(p["type"].as_str(), Some("text"), "part: {}", ctx());
                        p["text"]
                            .as_str()
                            .unwrap_or_else(|| panic!("part text: {}", ctx()))
                    })
                    .collect()
            }
        };
        assert_eq!(text, turn.content, "content: {}", ctx());
        if let Some(name) = m.get("name").filter(|n| !n.is_null()) {
            let name = name.as_str().unwrap_or_else(|| panic!("name: {}", ctx()));
            assert!(
                name.len() <= MAX_NAME_BYTES && !name.contains('\0'),
                "name {name:?}: {}",
                ctx()
            );
        }
        let keys = m.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
        assert!(
            keys.iter()
                .flatten()
                .all(|k| matches!(k.as_str(), "role" | "content" | "name")),
            "message keys {keys:?}: {}",
            ctx()
        );
    }
    assert!(all_parts <= MAX_ALL_PARTS, "{all_parts} parts: {}", ctx());

    // The fields it shares with a completions request, in their ranges.
    let s = &r.sampling;
    assert!((1..=128).contains(&r.n), "n: {}", ctx());
    assert!(r.logprobs.map_or(true, |k| k <= 20), "logprobs: {}", ctx());
    assert!(r.max_tokens >= 1, "max_tokens: {}", ctx());
    for (name, x, lo, hi) in [
        ("temperature", s.temperature, 0.0, 2.0),
        ("top_p", s.top_p, 0.0, 1.0),
        ("min_p", s.min_p, 0.0, 1.0),
        ("presence_penalty", s.presence_penalty, -2.0, 2.0),
        ("frequency_penalty", s.frequency_penalty, -2.0, 2.0),
    ] {
        assert!(x.is_finite() && (lo..=hi).contains(&x), "{name}: {}", ctx());
    }
    assert!(s.top_k <= i32::MAX as u32, "top_k: {}", ctx());
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
    assert!(r.stop.iter().all(|s| !s.is_empty()), "stop: {}", ctx());
    // `logprobs: true` asks for them (top_logprobs alternatives, else 0).
    let body_logprobs = raw.get("logprobs").is_some();
    assert_eq!(r.logprobs.is_some(), body_logprobs, "logprobs: {}", ctx());
}
