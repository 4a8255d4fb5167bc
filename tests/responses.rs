//! OpenAI's Responses API on `cmpl --serve`, with the tool model (Qwen2.5-
//! Coder 0.5B, real weights): a response whole and as its typed events, a
//! function call and its output given back, a thought as a reasoning item,
//! structured output, and what a stateless server refuses by name.

use crate::common;
use common::run::real_template;
use common::served::Served;
use serde_json::{json, Value};

fn served(extra: &[&str]) -> Served {
    Served::tool_model(extra)
}

fn ask(s: &Served, body: &Value) -> (u16, Value) {
    s.post_json("/v1/responses", body)
}

/// A stream's events: each one's data, its `type` checked against its name.
fn events(text: &str) -> Vec<Value> {
    text.split_terminator("\n\n")
        .enumerate()
        .map(|(i, e)| {
            let name = e.lines().next().unwrap().strip_prefix("event: ").unwrap();
            let data: Value =
                serde_json::from_str(e.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                    .unwrap();
            assert_eq!(data["type"], name, "{e}");
            assert_eq!(data["sequence_number"], i, "{e}");
            data
        })
        .collect()
}

#[test]
fn a_response_is_answered_whole_and_as_its_events() {
    let s = served(&[]);
    let body = json!({"model": "gpt-x", "max_output_tokens": 24, "temperature": 0,
        "instructions": "Answer in one short sentence.",
        "input": "What is the capital of France?"});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-x");
    assert_eq!(v["instructions"], "Answer in one short sentence.");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    let message = &v["output"][0];
    assert_eq!(message["type"], "message");
    let text = message["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(text, "Paris is the capital of France.", "{v}");
    assert_eq!(message["content"][0]["type"], "output_text");
    let usage = &v["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap())
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, raw) = s.send("POST", "/v1/responses", &streamed.to_string(), None);
    assert_eq!(status, 200, "{raw}");
    let evs = events(&raw);
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        &kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let joined: String = evs.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert_eq!(joined, text);
    let last = &evs[evs.len() - 1]["response"];
    assert_eq!(last["output"][0]["content"], v["output"][0]["content"]);
    // The same counts; the second ask reuses the first's cached prompt.
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(last["usage"][key], usage[key], "{key}");
    }
    assert_eq!(last["usage"]["input_tokens_details"]["cached_tokens"], 25);
    // Cut by the length: incomplete, and why.
    let mut short = body.clone();
    short["max_output_tokens"] = json!(3);
    let (_, v) = ask(&s, &short);
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
}

#[test]
fn a_function_is_called_and_its_output_answered() {
    let s = served(&[]);
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = json!({"model": "m", "max_output_tokens": 64, "temperature": 0, "tools": tools,
        "tool_choice": "required", "input": [question]});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    let call = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap()
        .clone();
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["city"], "Paris");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, raw) = s.send("POST", "/v1/responses", &streamed.to_string(), None);
    let evs = events(&raw);
    let done = evs
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .unwrap_or_else(|| panic!("{raw}"));
    assert_eq!(
        serde_json::from_str::<Value>(done["arguments"].as_str().unwrap()).unwrap()["city"],
        "Paris"
    );
    // The output given back: words.
    let input = json!([question, call, {"type": "function_call_output", "call_id": call["call_id"], "output": "{\"temperature\": 21, \"sky\": \"clear\"}"}]);
    let body = json!({"model": "m", "max_output_tokens": 40, "temperature": 0, "tools": tools,
        "tool_choice": "none", "input": input});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["type"], "message", "{v}");
    assert!(
        v["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("21"),
        "{v}"
    );
}

#[test]
fn a_thought_is_a_reasoning_item_and_a_schema_holds() {
    let qwen3 = real_template("Qwen-Qwen3-0.6B.jinja");
    let s = served(&["--chat-template", &qwen3]);
    let body = json!({"model": "m", "max_output_tokens": 48, "temperature": 0,
        "reasoning": {"effort": "low"}, "reasoning_budget": 4, "input": "What is 2+2?"});
    let (status, v) = ask(&s, &body);
    // `reasoning_budget` is cmpl's, not the API's: refused by name.
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "reasoning_budget");
    let body = json!({"model": "m", "max_output_tokens": 24, "temperature": 0,
        "reasoning": {"effort": "low"}, "input": "What is 2+2?"});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["type"], "reasoning", "{v}");
    assert!(
        !v["output"][0]["summary"][0]["text"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{v}"
    );
    // No reasoning asked: none.
    let body = json!({"model": "m", "max_output_tokens": 24, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "sum", "schema": {"type": "object",
            "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}}},
        "input": "What is 2+2? Answer in JSON."});
    let (status, v) = ask(&s, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["type"], "message", "{v}");
    let answer: Value =
        serde_json::from_str(v["output"][0]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert!(answer["sum"].is_i64(), "{v}");
    assert_eq!(v["text"]["format"]["type"], "json_schema");
}

#[test]
fn a_stateless_server_refuses_what_needs_state_by_name() {
    let s = served(&[]);
    for (body, param) in [
        (
            json!({"input": "Hi", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": "Hi", "store": true}), "store"),
        (
            json!({"input": "Hi", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
    ] {
        let (status, v) = ask(&s, &body);
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
}

#[test]
fn the_openai_sdk_speaks_to_it() {
    let s = served(&[]);
    common::sdk::python_script("responses_clients.py", &[&s.root()]);
}
