//! Thinking models' reasoning kept apart from the answer, on real weights
//! (Qwen2.5-Coder 0.5B) given real thinking templates (Qwen3's, a
//! DeepSeek-R1 distillation's, gpt-oss's) from llama.cpp's collection. The
//! model never closes a reasoning by itself, so a budget forces the close
//! and the split is exact, greedy.

use crate::common;
use common::run::{cmpl, real_template, tool_model_path};
use common::served::Served;
use serde_json::{json, Value};

const QUESTION: &str = "What is 2+2?";
const ANSWER: &str = "<answer>\n4\n</answer>";

fn qwen3() -> String {
    real_template("Qwen-Qwen3-0.6B.jinja")
}

fn ask(template: &str, extra: &[&str]) -> common::run::Output {
    let model = tool_model_path().display().to_string();
    let mut args = vec!["-m", &model, "--chat-template", template];
    args.extend(["--temperature", "0", "--max-tokens", "48"]);
    cmpl(&args).args(extra).args([QUESTION]).run()
}

#[test]
fn a_budget_closes_the_reasoning_and_the_answer_follows_apart() {
    let t = qwen3();
    let v = ask(&t, &["--reasoning-budget", "4", "--json"]).json();
    let choice = &v["choices"][0];
    assert_eq!(choice["reasoning_content"], "2 + 2", "{v}");
    assert_eq!(choice["text"], ANSWER, "{v}");
    assert_eq!(choice["finish_reason"], "stop");
    // Usage counts the thinking: 4 tokens, the forced close, the answer.
    assert_eq!(v["usage"]["completion_tokens"], 17, "{v}");
    common::schema::assert_valid("CompletionResponse", &v);
    // A budget of none: the close at once, the reasoning empty.
    let v = ask(&t, &["--reasoning-budget", "0", "--json"]).json();
    assert_eq!(v["choices"][0]["reasoning_content"], "", "{v}");
    assert_eq!(
        v["choices"][0]["text"],
        "I'm sorry, but I can't assist with that."
    );
}

#[test]
fn text_mode_prints_the_answer_and_the_reasoning_on_stderr_when_shown() {
    let t = qwen3();
    // Piped stderr: hidden by default.
    let out = ask(&t, &["--reasoning-budget", "4"]);
    assert_eq!(out.ok(), ANSWER);
    assert!(!out.stderr.contains("2 + 2"), "{}", out.stderr);
    let out = ask(&t, &["--reasoning-budget", "4", "--reasoning", "show"]);
    assert_eq!(out.ok(), ANSWER);
    assert_eq!(out.stderr, "2 + 2\n");
    let out = ask(&t, &["--reasoning-budget", "4", "--reasoning", "hide"]);
    assert_eq!(out.ok(), ANSWER);
    assert_eq!(out.stderr, "");
}

#[test]
fn a_stream_sends_the_reasoning_in_its_own_field() {
    let out = ask(&qwen3(), &["--reasoning-budget", "4", "--json", "--stream"]);
    let chunks = out.sse();
    let joined = |key: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0][key].as_str())
            .collect()
    };
    assert_eq!(joined("reasoning_content"), "2 + 2");
    assert_eq!(joined("text"), ANSWER);
    let delta: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning"].as_str())
        .collect();
    assert_eq!(delta, "2 + 2", "the contract's delta.reasoning");
    for c in &chunks {
        common::schema::assert_valid("CompletionChunk", c);
    }
}

#[test]
fn no_think_renders_the_template_without_reasoning() {
    let out = ask(&qwen3(), &["--no-think", "--json", "--echo"]);
    let v = out.json();
    let prompt = v["prompt"][0]["text"].as_str().unwrap();
    // Qwen3's own `enable_thinking` false: the reasoning closed, empty.
    assert!(
        prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{prompt:?}"
    );
    assert!(v["choices"][0].get("reasoning_content").is_none(), "{v}");
    // The last of --think and --no-think wins.
    let out = ask(&qwen3(), &["--no-think", "--think", "--json", "--echo"]);
    let v = out.json();
    let prompt = v["prompt"][0]["text"].as_str().unwrap();
    assert!(prompt.ends_with("assistant\n<think>\n"), "{prompt:?}");
}

#[test]
fn a_template_that_opens_the_reasoning_is_not_opened_twice() {
    let t = real_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    let v = ask(&t, &["--reasoning-budget", "4", "--json", "--echo"]).json();
    let prompt = v["prompt"][0]["text"].as_str().unwrap();
    assert!(prompt.ends_with("<｜Assistant｜><think>\n"), "{prompt:?}");
    assert!(v["choices"][0]["reasoning_content"].is_string(), "{v}");
    // gpt-oss: the analysis channel, closed by the final one.
    let t = real_template("openai-gpt-oss-120b.jinja");
    let v = ask(&t, &["--reasoning-budget", "6", "--json", "--echo"]).json();
    let prompt = v["prompt"][0]["text"].as_str().unwrap();
    assert!(
        prompt.ends_with("<|start|>assistant<|channel|>analysis<|message|>"),
        "{prompt:?}"
    );
    assert_eq!(v["choices"][0]["reasoning_content"], "2+2 equals 4", "{v}");
    assert!(!v["choices"][0]["text"]
        .as_str()
        .unwrap()
        .contains("final<|message|>"));
}

#[test]
fn structured_output_applies_to_the_answer_after_the_thinking() {
    let schema =
        r#"{"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"]}"#;
    let model = tool_model_path().display().to_string();
    let t = qwen3();
    let out = cmpl(&["-m", &model, "--chat-template", &t, "--temperature", "0"])
        .args(["--reasoning-budget", "4", "--json-schema", schema, "--json"])
        .args(["Give the answer to 2+2 as JSON."])
        .run();
    let v = out.json();
    assert_eq!(v["choices"][0]["reasoning_content"], "2 + 2", "{v}");
    assert_eq!(v["choices"][0]["text"], "{\"answer\": 4}", "{v}");
}

#[test]
fn thinking_asked_where_it_cannot_be_is_refused_by_field() {
    let model = tool_model_path().display().to_string();
    // Qwen2.5's own template shows no reasoning.
    cmpl(&["-m", &model, "--reasoning-budget", "4", QUESTION])
        .run()
        .fails(2, "`reasoning_budget` applies to a model that thinks");
    cmpl(&["-m", &model, "--think", QUESTION])
        .run()
        .fails(2, "--chat-template");
    ask(&qwen3(), &["--no-think", "--reasoning-budget", "2"]).fails(2, "leave out one of them");
    // SmolLM3's template closes the reasoning when told not to think in
    // its system prompt.
    let t = real_template("HuggingFaceTB-SmolLM3-3B.jinja");
    let v = ask(&t, &["--no-think", "--json", "--echo"]).json();
    let prompt = v["prompt"][0]["text"].as_str().unwrap();
    assert!(prompt.trim_end().ends_with("</think>"), "{prompt:?}");
    assert!(v["choices"][0].get("reasoning_content").is_none(), "{v}");
}

#[test]
fn the_chat_endpoint_and_a_batch_line_carry_reasoning_content() {
    let model = tool_model_path().display().to_string();
    let served = Served::start(&["-m", &model, "--trust-request-templates"], &[]);
    let template = std::fs::read_to_string(qwen3()).unwrap();
    let body = json!({"messages": [{"role": "user", "content": QUESTION}],
        "chat_template": template, "reasoning_budget": 4, "temperature": 0, "max_tokens": 48});
    let (status, text) = served.send("POST", "/v1/chat/completions", &body.to_string(), None);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let message = &v["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "2 + 2", "{v}");
    assert_eq!(message["content"], ANSWER, "{v}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, text) = served.send("POST", "/v1/chat/completions", &streamed.to_string(), None);
    assert_eq!(status, 200, "{text}");
    let deltas: Vec<Value> = text
        .split_terminator("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"].get(0).map(|c| c["delta"].clone()))
        .collect();
    let joined = |key: &str| -> String { deltas.iter().filter_map(|d| d[key].as_str()).collect() };
    assert_eq!(joined("reasoning_content"), "2 + 2", "{text}");
    assert_eq!(joined("content"), ANSWER, "{text}");
    drop(served);
    // A batch line: the chat completion as the endpoint answers it.
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": QUESTION}], "reasoning_budget": 4,
            "temperature": 0, "max_tokens": 48}});
    let t = qwen3();
    let out = cmpl(&["-m", &model, "--chat-template", &t, "--batch"])
        .stdin(format!("{line}\n"))
        .run();
    let v: Value = serde_json::from_str(out.ok().trim_end()).unwrap();
    let message = &v["response"]["body"]["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "2 + 2", "{v}");
    assert_eq!(message["content"], ANSWER, "{v}");
}

#[test]
fn an_assistant_turns_reasoning_goes_back_to_a_template_that_reads_it() {
    let model = tool_model_path().display().to_string();
    let t = qwen3();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let call = json!([{"id": "call_0", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]);
    let mut body = json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": call,
            "reasoning_content": "\nThe user wants Paris; call the tool.\n"},
        {"role": "tool", "tool_call_id": "call_0", "content": "18 C"}],
        "tools": tools, "max_tokens": 1, "temperature": 0, "echo": true});
    let out = cmpl(&["-m", &model, "--chat-template", &t, "--json"])
        .stdin(body.to_string())
        .run();
    let v = out.json();
    let prompt = v["prompt"][0]["text"].as_str().unwrap();
    // Qwen3's template keeps the thinking of a turn after the last question.
    assert!(
        prompt.contains("<|im_start|>assistant\n<think>\nThe user wants Paris; call the tool.\n</think>\n\n<tool_call>"),
        "{prompt:?}"
    );
    // It belongs to an assistant's turn, and is text.
    body["messages"][0]["reasoning_content"] = json!("no");
    cmpl(&["-m", &model, "--chat-template", &t, "--json"])
        .stdin(body.to_string())
        .run()
        .fails(
            2,
            "`messages[0].reasoning_content` belongs to an assistant's message",
        );
    body["messages"][0]
        .as_object_mut()
        .unwrap()
        .remove("reasoning_content");
    body["messages"][1]["reasoning_content"] = json!(7);
    cmpl(&["-m", &model, "--chat-template", &t, "--json"])
        .stdin(body.to_string())
        .run()
        .fails(
            2,
            "`messages[1].reasoning_content` must be a string, not the number 7",
        );
}

#[test]
fn a_tool_call_follows_the_thinking_constrained_as_ever() {
    let model = tool_model_path().display().to_string();
    let t = qwen3();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}]);
    let body = json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools, "tool_choice": "required", "reasoning_budget": 4,
        "max_tokens": 64, "temperature": 0});
    let out = cmpl(&["-m", &model, "--chat-template", &t, "--json"])
        .stdin(body.to_string())
        .run();
    let v = out.json();
    let choice = &v["choices"][0];
    // The thinking is free and apart; the answer after it is the call.
    let reasoning = choice["reasoning_content"].as_str().unwrap();
    assert!(
        !reasoning.is_empty() && !reasoning.contains("</think>"),
        "{v}"
    );
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["city"], "Paris", "{v}");
    common::schema::assert_valid("CompletionResponse", &v);
}

#[test]
fn a_thought_that_ends_the_answer_is_followed_by_one() {
    // QwQ's template opens the thought; the model closes it and ends at
    // once. It answers all the same, within its tokens.
    let model = tool_model_path().display().to_string();
    let qwq = real_template("Qwen-QwQ-32B.jinja");
    let ask = |tokens: &str| {
        cmpl(&["-m", &model, "--chat-template", &qwq, "--temperature", "0"])
            .args(["--reasoning-budget", "30", "--max-tokens", tokens, "--json"])
            .args(["What is 2+2?"])
            .run()
            .json()
    };
    let v = ask("64");
    let choice = &v["choices"][0];
    assert_eq!(choice["reasoning_content"], "2 + 2 equals 4.", "{v}");
    assert!(
        choice["text"]
            .as_str()
            .unwrap()
            .starts_with("This is a simple arithmetic"),
        "{v}"
    );
    // The thought took 11 tokens and its close: none left, no answer.
    let v = ask("12");
    assert_eq!(v["choices"][0]["text"], "", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
}
