//! What this server takes of a request body: the config's defaults under
//! it, its template (the operator's, or the body's where trusted), `n`
//! within the slots, and the model it names.

use super::limits::PROMPTS_PER_SLOT;
use super::reply::Refusal;
use crate::config::Config;
use crate::error::CmplError;
use crate::fields;
use crate::options::ServeOptions;
use crate::request::{RawRequest, Request};
use hyper::StatusCode;

/// What the server takes of request bodies: fixed at start-up.
pub struct Policy {
    /// The model it serves, the name responses carry.
    pub model: String,
    strict_model: bool,
    trust_request_templates: bool,
    /// The config's request fields, under each body's.
    defaults: RawRequest,
    /// `--chat-template` (or the config's): the template of every chat
    /// request, the model's own otherwise. Not a default of the other
    /// requests, as it would be a one-shot's (where it implies `--chat`).
    template: Option<serde_json::Value>,
    /// Slots: a request's `n` can be no larger.
    pub parallel: u32,
    /// Prompts one body may list.
    list_limit: usize,
    /// Whose shape the answers take (`--compat`).
    compat: crate::options::Compat,
}

impl Policy {
    /// The policy of a server of `parallel` slots (of `several` models,
    /// which the router picks among by name: none is strict here).
    pub fn new(
        model: String,
        config: &Config,
        opts: &ServeOptions,
        parallel: u32,
        several: bool,
    ) -> Policy {
        let mut defaults = config.request.clone();
        defaults.fields.remove(fields::CHAT_TEMPLATE.name);
        Policy {
            model,
            strict_model: opts.strict_model && !several,
            trust_request_templates: opts.trust_request_templates,
            defaults,
            template: config.request.get(fields::CHAT_TEMPLATE.name).cloned(),
            parallel,
            list_limit: parallel as usize * PROMPTS_PER_SLOT,
            compat: opts.compat,
        }
    }

    /// Whether bodies may bring their own chat templates.
    pub fn trusts_templates(&self) -> bool {
        self.trust_request_templates
    }

    /// The body as validated requests (one per prompt), over the config's
    /// defaults: the same checks and messages as a request on the command line,
    /// and what this server can take (`n` within its slots).
    pub fn parse(&self, body: &[u8]) -> std::result::Result<Vec<Request>, Refusal> {
        let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
        let text = utf8(body)?;
        let body = RawRequest::from_json(text, "the request body").map_err(bad)?;
        self.untrusted_templates(&body)?;
        let raw = self.with_template(self.defaults.clone().overlay(body));
        // A list is as many requests: bounded by the slots that answer them.
        let Some(each) = raw.prompts(self.list_limit).map_err(bad)? else {
            return Ok(vec![self.one(&raw)?]);
        };
        let requests = each
            .iter()
            .map(|raw| self.one(raw))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if requests[0].stream {
            return Err(bad(CmplError::invalid(
                fields::PROMPT.name,
                "a list of several prompts cannot be streamed here; send one request per prompt, or leave out `stream`",
            )));
        }
        Ok(requests)
    }

    /// A chat body as one validated request over the config's defaults, and
    /// whether its stream ends with a usage chunk.
    pub fn parse_chat(&self, body: &[u8]) -> std::result::Result<(Request, bool), Refusal> {
        self.parse_conversation(body, crate::chat_body::request)
    }

    /// A body of any conversation API (chat completions, Messages,
    /// Responses) as one validated request over the config's defaults:
    /// `read` says it in the chat fields, with what its answer's shape
    /// needs of it.
    pub fn parse_conversation<T>(
        &self,
        body: &[u8],
        read: impl FnOnce(&str) -> crate::error::Result<(RawRequest, T)>,
    ) -> std::result::Result<(Request, T), Refusal> {
        let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
        let text = utf8(body)?;
        let (raw, shaped) = read(text).map_err(bad)?;
        self.untrusted_templates(&raw)?;
        let raw = self.with_template(self.defaults.clone().overlay(raw));
        Ok((self.one(&raw)?, shaped))
    }

    /// A template in a request body is a program the server would run for a
    /// stranger: refused unless the operator trusts its clients' templates.
    fn untrusted_templates(&self, body: &RawRequest) -> std::result::Result<(), Refusal> {
        if self.trust_request_templates {
            return Ok(());
        }
        match crate::request::TEMPLATE_FIELDS.iter().find(|f| body.get(f).is_some()) {
            Some(field) => Err((
                StatusCode::BAD_REQUEST,
                CmplError::invalid(
                    field,
                    format!("`{field}`: this server does not run templates sent in requests (a template is a program); leave it out to use the model's own, or the operator starts the server with --trust-request-templates"),
                ),
            )),
            None => Ok(()),
        }
    }

    /// A chat request (`messages`, `chat`, `system`) gets the server's template
    /// where it brings none of its own.
    fn with_template(&self, mut raw: RawRequest) -> RawRequest {
        let chat = raw.get(fields::MESSAGES.name).is_some()
            || raw.get(fields::SYSTEM.name).is_some()
            || raw.get(fields::CHAT.name) == Some(&serde_json::Value::Bool(true));
        if let (true, None, Some(template)) =
            (chat, raw.get(fields::CHAT_TEMPLATE.name), &self.template)
        {
            raw.set(fields::CHAT_TEMPLATE.name, template.clone());
        }
        raw
    }

    fn one(&self, raw: &RawRequest) -> std::result::Result<Request, Refusal> {
        let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
        let mut request = Request::validate(raw).map_err(bad)?;
        self.compat.apply(&mut request);
        if request.n > self.parallel {
            return Err(bad(CmplError::invalid(
                fields::N.name,
                format!(
                    "`n` is {} and this server decodes at most {} choices at once (--parallel); lower n",
                    request.n, self.parallel
                ),
            )));
        }
        if let Some(named) = &request.model {
            if self.strict_model && *named != self.model {
                return Err((
                    StatusCode::NOT_FOUND,
                    CmplError::invalid(
                        fields::MODEL.name,
                        format!("this server serves `{}`, not `{named}`", self.model),
                    ),
                ));
            }
        }
        Ok(request)
    }
}

fn utf8(body: &[u8]) -> std::result::Result<&str, Refusal> {
    std::str::from_utf8(body).map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            CmplError::invalid("request", "the request body is not UTF-8"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Listen;
    use serde_json::json;

    fn policy(config: serde_json::Value, trust: bool, strict: bool) -> Policy {
        let mut request = RawRequest::default();
        for (k, v) in config.as_object().unwrap() {
            request.set(k, v.clone());
        }
        let config = Config {
            request,
            ..Config::default()
        };
        let opts = ServeOptions {
            parallel: Some(2),
            strict_model: strict,
            ..crate::serve::tests::serve_options(Listen::Tcp("127.0.0.1:0".parse().unwrap()), trust)
        };
        Policy::new("served".into(), &config, &opts, 2, false)
    }

    fn refused(outcome: std::result::Result<Vec<Request>, Refusal>) -> (u16, CmplError) {
        let (status, e) = outcome.expect_err("refused");
        (status.as_u16(), e)
    }

    #[test]
    fn bodies_take_the_config_under_them_and_n_within_the_slots() {
        let p = policy(json!({"max_tokens": 7, "temperature": 0}), false, false);
        let r = p.parse(br#"{"prompt": "a", "temperature": 1}"#).unwrap();
        assert_eq!((r[0].max_tokens, r[0].sampling.temperature), (7, 1.0));
        let (status, e) = refused(p.parse(br#"{"prompt": "a", "n": 3}"#));
        assert_eq!((status, e.param.as_deref()), (400, Some("n")));
        assert!(e.message.contains("at most 2 choices"), "{}", e.message);
        let (status, e) = refused(p.parse(b"\xff"));
        assert_eq!(
            (status, e.message.as_str()),
            (400, "the request body is not UTF-8")
        );
    }

    #[test]
    fn a_list_of_prompts_is_one_request_each_and_never_a_stream() {
        let p = policy(json!({}), false, false);
        assert_eq!(p.parse(br#"{"prompt": ["a", "b"]}"#).unwrap().len(), 2);
        let (_, e) = refused(p.parse(br#"{"prompt": ["a", "b"], "stream": true}"#));
        assert!(e.message.contains("cannot be streamed"), "{}", e.message);
    }

    #[test]
    fn templates_in_bodies_only_where_trusted_and_the_operators_for_chats() {
        let body = br#"{"prompt": "a", "chat": true, "chat_template": "{{ messages }}"}"#;
        let (status, e) = refused(policy(json!({}), false, false).parse(body));
        assert_eq!((status, e.param.as_deref()), (400, Some("chat_template")));
        assert!(e.message.contains("--trust-request-templates"));
        assert!(policy(json!({}), true, false).parse(body).is_ok());
        // The config's template: every chat request's, no other request's.
        let p = policy(json!({"chat_template": "{{ 'X' }}"}), false, false);
        let chat = p.parse(br#"{"prompt": "a", "chat": true}"#).unwrap();
        assert!(chat[0].chat.as_ref().unwrap().template.is_some());
        assert!(p.parse(br#"{"prompt": "a"}"#).unwrap()[0].chat.is_none());
        let (chat, usage) = p
            .parse_chat(br#"{"messages": [{"role": "user", "content": "hi"}]}"#)
            .unwrap();
        assert!(chat.chat.unwrap().template.is_some() && !usage);
    }

    #[test]
    fn a_strict_server_answers_only_for_its_model() {
        let body = br#"{"prompt": "a", "model": "other"}"#;
        assert!(policy(json!({}), false, false).parse(body).is_ok());
        let (status, e) = refused(policy(json!({}), false, true).parse(body));
        assert_eq!(status, 404);
        assert_eq!(e.message, "this server serves `served`, not `other`");
    }
}
