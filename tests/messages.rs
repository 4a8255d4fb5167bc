//! Anthropic's Messages API on `cmpl --serve`, with the tool model (Qwen2.5-
//! Coder 0.5B, real weights, its own template): a whole answer and its
//! stream of events, a tool call and its result, a thought, the token count,
//! the API key as `x-api-key`, and bad bodies in the API's error shape.

use crate::common;
use common::run::{real_template, tool_model_path};
use common::served::Served;
use serde_json::{json, Value};

fn served(extra: &[&str]) -> Served {
    Served::tool_model(extra)
}

fn ask(s: &Served, body: &Value) -> (u16, Value) {
    s.post_json("/v1/messages", body)
}

/// A stream's events: each one's name and data.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split_terminator("\n\n")
        .map(|e| {
            let name = e.lines().next().unwrap().strip_prefix("event: ").unwrap();
            let data = e.lines().nth(1).unwrap().strip_prefix("data: ").unwrap();
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

#[test]
fn a_message_is_answered_whole_and_streamed_alike() {
    let s = served(&[]);
    let body = json!({"model": "claude-x", "max_tokens": 24, "temperature": 0,
        "system": "Answer in one short sentence.",
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-x");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["content"][0]["type"], "text");
    let text = v["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(text, "Paris is the capital of France.", "{v}");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    let usage = &v["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 10, "{v}");
    // Streamed: the API's events in order, and the same text.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, raw) = s.send("POST", "/v1/messages", &streamed.to_string(), None);
    assert_eq!(status, 200, "{raw}");
    let evs = events(&raw);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let joined: String = evs
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    let (_, end) = &evs[evs.len() - 2];
    assert_eq!(end["delta"]["stop_reason"], "end_turn");
    assert_eq!(end["usage"], *usage);
    // A stop sequence that ends it is named.
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!(["France"]);
    let (_, v) = ask(&s, &stopped);
    assert_eq!(v["content"][0]["text"], "Paris is the capital of ");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "France");
    // The prompt's tokens, counted as the answer counts them.
    let count = json!({"model": "m", "system": body["system"], "messages": body["messages"]});
    let (status, n) = s.send(
        "POST",
        "/v1/messages/count_tokens",
        &count.to_string(),
        None,
    );
    assert_eq!(status, 200, "{n}");
    let n: Value = serde_json::from_str(&n).unwrap();
    assert_eq!(n["input_tokens"], usage["input_tokens"]);
}

#[test]
fn a_tool_is_called_and_its_result_answered() {
    let s = served(&[]);
    let tools = json!([{"name": "get_weather", "description": "Get the current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = json!({"model": "m", "max_tokens": 64, "temperature": 0, "tools": tools,
        "tool_choice": {"type": "any"}, "messages": [question]});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let call = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["input"]["city"], "Paris");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    // Streamed: the call as a block, its input as one JSON delta.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, raw) = s.send("POST", "/v1/messages", &streamed.to_string(), None);
    let evs = events(&raw);
    let start = evs
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{raw}"));
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let input: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap()["city"],
        "Paris"
    );
    assert_eq!(evs[evs.len() - 2].1["delta"]["stop_reason"], "tool_use");
    // The result given back: the model answers in words.
    let turn = json!([question,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
            "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}]}]);
    let body = json!({"model": "m", "max_tokens": 40, "temperature": 0, "tools": tools,
        "tool_choice": {"type": "none"}, "messages": turn});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["content"][0]["type"], "text", "{v}");
    assert!(
        v["content"][0]["text"].as_str().unwrap().contains("21"),
        "{v}"
    );
}

#[test]
fn thinking_is_a_block_before_the_answer() {
    let qwen3 = real_template("Qwen-Qwen3-0.6B.jinja");
    let s = served(&["--chat-template", &qwen3]);
    let body = json!({"model": "m", "max_tokens": 48, "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 4},
        "messages": [{"role": "user", "content": "What is 2+2?"}]});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["content"][0],
        json!({"type": "thinking", "thinking": "2 + 2", "signature": ""})
    );
    assert_eq!(
        v["content"][1],
        json!({"type": "text", "text": "<answer>\n4\n</answer>"})
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, raw) = s.send("POST", "/v1/messages", &streamed.to_string(), None);
    let evs = events(&raw);
    let kinds: Vec<&str> = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["type"].as_str())
        .collect();
    let first_text = kinds.iter().position(|k| *k == "text_delta").unwrap();
    assert!(
        kinds[..first_text]
            .iter()
            .all(|k| *k == "thinking_delta" || *k == "signature_delta"),
        "{raw}"
    );
    assert_eq!(
        kinds[first_text - 1],
        "signature_delta",
        "the thought's block closes first"
    );
    let thought: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(thought, "2 + 2");
}

#[test]
fn keys_and_bad_bodies_are_answered_in_the_apis_shape() {
    let model = tool_model_path().display().to_string();
    let s = Served::start(&["-m", &model], &[("CMPL_API_KEY", "sesame")]);
    let body = json!({"model": "m", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hi"}]})
    .to_string();
    let (status, text) = s.send_with("POST", "/v1/messages", &body, &[]);
    assert_eq!(status, 401, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    let (status, text) = s.send_with("POST", "/v1/messages", &body, &[("x-api-key", "sesame")]);
    assert_eq!(status, 200, "{text}");
    let key = [("x-api-key", "sesame")];
    for (bad, named) in [
        (
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
            "`max_tokens` is required",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "`messages[0].content[0]` is a \"image\" block",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "service_tier": "auto"}),
            "unknown field `service_tier`",
        ),
    ] {
        let (status, text) = s.send_with("POST", "/v1/messages", &bad.to_string(), &key);
        assert_eq!(status, 400, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(named),
            "{v}"
        );
    }
}

#[test]
fn the_anthropic_sdk_speaks_to_it() {
    let qwen3 = real_template("Qwen-Qwen3-0.6B.jinja");
    let s = served(&["--chat-template", &qwen3]);
    common::sdk::python_script("messages_clients.py", &[&s.root()]);
}
