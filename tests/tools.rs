//! Tool calls on the tool model (Qwen2.5-Coder 0.5B Instruct, real weights,
//! its own template): the SDKs' tools through the chat endpoint, a call on
//! the command line in text and JSON, and bad tools refused by field.

use crate::common;
use common::run::{cmpl, second_model_path, tool_model_path};
use common::served::Served;
use serde_json::{json, Value};

fn weather() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}}])
}

fn tools_file(dir: &tempfile::TempDir, tools: &Value) -> String {
    let path = dir.path().join("tools.json");
    std::fs::write(&path, tools.to_string()).unwrap();
    path.display().to_string()
}

#[test]
fn the_sdks_call_tools_through_the_chat_endpoint() {
    let model = tool_model_path().display().to_string();
    let served = Served::start(&["-m", &model], &[]);
    common::sdk::python_script("tool_clients.py", &[&served.root()]);
}

#[test]
fn a_call_on_the_command_line_is_one_json_line_and_tool_calls_in_json() {
    let model = tool_model_path().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&dir, &weather());
    let ask = ["-m", &model, "--tools", &tools, "--temperature", "0"];
    let out = cmpl(&ask).args(["What is the weather in Paris?"]).run();
    assert_eq!(
        out.ok(),
        "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"celsius\"}}\n"
    );
    // `none`: the tools shown, the answer in words, as it comes.
    let out = cmpl(&ask)
        .args(["--tool-choice", "none", "--max-tokens", "24"])
        .args(["Write a haiku about the sea."])
        .run();
    assert_eq!(
        out.ok(),
        "Sea whispers,\nWhispers of the sea,\nWhispers of the sea."
    );
    // --json: the text as the model wrote it, and the calls it reads as.
    let out = cmpl(&ask)
        .args(["--json", "--tool-choice", "get_weather"])
        .args(["What is the weather in Paris?"])
        .run();
    let v = out.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["index"], 0);
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["city"], "Paris");
    common::schema::assert_valid("CompletionResponse", &v);
    // A JSON request with messages and tools on stdin: the same call.
    let request = json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": weather(), "tool_choice": "required", "temperature": 0});
    let out = cmpl(&["-m", &model, "--json"])
        .stdin(request.to_string())
        .run();
    assert_eq!(
        out.json()["choices"][0]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    // Through a resident, the same line, the second time from the warm model.
    let runtime = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = cmpl(&ask)
            .args(["--keep-alive", "60s", "What is the weather in Paris?"])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .run();
        assert!(
            out.ok().starts_with("{\"name\": \"get_weather\""),
            "{}",
            out.stdout
        );
    }
    cmpl(&["--stop-resident", "all"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .run()
        .ok();
    // An OpenAI batch line for the chat endpoint: the call in its response.
    let line = json!({"custom_id": "w", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                 "tools": weather(), "temperature": 0}});
    let out = cmpl(&["-m", &model, "--batch"])
        .stdin(line.to_string())
        .run();
    let v: Value = serde_json::from_str(out.ok().trim()).unwrap();
    let body = &v["response"]["body"];
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(body["choices"][0]["message"]["content"], Value::Null, "{v}");
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
}

#[test]
fn bad_tools_are_refused_by_the_field_that_holds_them() {
    let model = tool_model_path().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let run = |tools: &Value, extra: &[&str]| {
        let file = tools_file(&dir, tools);
        cmpl(&["-m", &model, "--tools", &file, "hi"])
            .args(extra)
            .run()
    };
    run(&weather(), &["--tool-choice", "get_stock"]).fails(
        2,
        "`tool_choice` names \"get_stock\", which is not among the tools: get_weather",
    );
    let bad_schema = json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}}}]);
    run(&bad_schema, &[]).fails(
        2,
        "`tools[0].function.parameters` (f) is a JSON Schema that cannot be enforced",
    );
    run(
        &json!([{"type": "function", "function": {"name": "no spaces"}}]),
        &[],
    )
    .fails(2, "`tools[0].function.name` must be 1 to 64 letters");
    let many: Vec<Value> = (0..129)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    run(&json!(many), &[]).fails(2, "has 129 tools; a request offers at most 128");
    let long = json!([{"type": "function", "function": {"name": "f",
        "description": "x".repeat(256 * 1024)}}]);
    run(&long, &[]).fails(2, "is over 256 KiB; shorten the descriptions");
    run(&weather(), &["--json-object"]).fails(2, "one constraint per request");
    // A template that never reads `tools` would drop them: said, with the fix.
    let smol = second_model_path().display().to_string();
    let file = tools_file(&dir, &weather());
    cmpl(&["-m", &smol, "--tools", &file, "hi"])
        .run()
        .fails(2, "the chat template ignores `tools`");
    // On the server: a 400 that names the field.
    let served = Served::start(&["-m", &model], &[]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": weather(),
        "tool_choice": {"type": "function", "function": {"name": "get_stock"}}});
    let (status, text) = served.send("POST", "/v1/chat/completions", &body.to_string(), None);
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["param"], "tool_choice.function.name", "{v}");
    let body = json!({"messages": [{"role": "tool", "content": "21", "tool_calls": []}]});
    let (status, text) = served.send("POST", "/v1/chat/completions", &body.to_string(), None);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("belongs to an assistant's message"), "{text}");
}

/// Other families' real templates (llama.cpp's collection) given to the
/// tool model: each renders the tools, the call is constrained to the
/// family's format and read back, and a second turn that carries the API's
/// call ids renders (Mistral's templates take only nine-character ids).
#[test]
fn each_familys_template_renders_the_tools_and_its_calls_parse() {
    let model = tool_model_path().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&dir, &weather());
    let families = [
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", "\"parameters\""),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            "\"arguments\"",
        ),
        (
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
            "\"arguments\"",
        ),
        ("Qwen-Qwen3-0.6B.jinja", "\"arguments\""),
        // The framed families: each argument a tagged element, or the
        // name outside the JSON.
        ("Qwen3-Coder.jinja", "<parameter=city>\nParis\n</parameter>"),
        ("GLM-4.6.jinja", "<arg_key>city</arg_key>\n<arg_value>Paris"),
        (
            "MiniMax-M2.jinja",
            "<parameter name=\"city\">Paris</parameter>",
        ),
        (
            "moonshotai-Kimi-K2.jinja",
            "<|tool_call_begin|>functions.get_weather:",
        ),
        // Its template shows no tools: cmpl shows them in the system message.
        (
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "get_weather<｜tool▁sep｜>{",
        ),
        // gpt-oss: a call is a message of its own, on the commentary channel.
        (
            "openai-gpt-oss-120b.jinja",
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{",
        ),
    ];
    for (name, key) in families {
        let t = common::run::real_template(name);
        // Answers, not thoughts, where the template thinks (a template that
        // does not takes it as well).
        let out = cmpl(&[
            "-m",
            &model,
            "--chat-template",
            &t,
            "--tools",
            &tools,
            "--no-think",
        ])
        .args([
            "--tool-choice",
            "required",
            "--parallel-tool-calls",
            "false",
            "--temperature",
            "0",
            "--max-tokens",
            "96",
        ])
        .args(["--json", "--echo", "What is the weather in Paris?"])
        .run();
        let v = out.json();
        let prompt = v["prompt"][0]["text"].as_str().unwrap();
        assert!(prompt.contains("get_weather"), "{name}: {prompt:?}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{name}: {v}");
        let text = choice["text"].as_str().unwrap();
        assert!(text.contains(key), "{name}: {text:?}");
        let call = &choice["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{name}: {v}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args["city"], "Paris", "{name}: {v}");
        // The second turn, with the id the API gave the call.
        let id = choice["tool_calls"][0]["id"].as_str().unwrap();
        let body = json!({"messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": id, "content": "21 C, clear"}],
            "tools": weather(), "tool_choice": "none", "max_tokens": 1, "echo": true});
        let v = cmpl(&["-m", &model, "--chat-template", &t, "--json"])
            .stdin(body.to_string())
            .run()
            .json();
        let prompt = v["prompt"][0]["text"].as_str();
        let prompt = prompt.unwrap_or_else(|| panic!("{name}: {v}"));
        assert!(prompt.contains("21 C, clear"), "{name}: {prompt:?}");
    }
}

/// `request` sent to `served`'s chat endpoint: the body of its 200 answer.
fn chat(served: &Served, request: &Value) -> String {
    let (status, body) = served.send("POST", "/v1/chat/completions", &request.to_string(), None);
    assert_eq!(status, 200, "{body}");
    body
}

/// The data of an SSE body, `[DONE]` left out.
fn events(body: &str) -> Vec<Value> {
    body.split_terminator("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[test]
fn a_cut_answer_keeps_the_calls_it_wrote_whole_on_every_face() {
    // Given a tool's result, the model calls again and again; 40 tokens
    // end it inside its third call.
    let model = tool_model_path().display().to_string();
    let request = json!({"messages": [
        {"role": "user", "content": "What is the weather in Paris, London and Tokyo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Paris: 12 C, cloudy"}],
        "tools": weather(), "temperature": 0, "max_tokens": 40});
    let cities = |calls: &[Value]| -> Vec<String> {
        calls
            .iter()
            .map(|c| {
                let args: Value =
                    serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                args["city"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let cut = "{\"name\": \"get_weather\", \"";
    // The command line's JSON: the completions shape.
    let v = cmpl(&["-m", &model, "--json"])
        .stdin(request.to_string())
        .run()
        .json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    let calls = choice["tool_calls"].as_array().unwrap();
    assert_eq!(cities(calls), ["Paris", "London"], "{v}");
    common::schema::assert_valid("CompletionResponse", &v);
    // The chat endpoint, whole: the two calls, the cut rest as content.
    let served = Served::start(&["-m", &model], &[]);
    let body = chat(&served, &request);
    let v: Value = serde_json::from_str(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{v}");
    let message = &choice["message"];
    assert_eq!(
        cities(message["tool_calls"].as_array().unwrap()),
        ["Paris", "London"]
    );
    assert_eq!(message["content"], cut, "{v}");
    // Streamed: the same calls, each sent once whole, and the same content.
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let body = chat(&served, &streamed);
    let chunks = events(&body);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).collect();
    let content: String = deltas
        .iter()
        .filter_map(|d| d["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, cut, "{body}");
    let mut joined: Vec<Value> = Vec::new();
    for d in deltas
        .iter()
        .filter_map(|d| d["delta"]["tool_calls"].as_array())
    {
        for part in d {
            let i = part["index"].as_u64().unwrap() as usize;
            if i == joined.len() {
                joined.push(json!({"function": {"arguments": ""}}));
            }
            let args = joined[i]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_string()
                + part["function"]["arguments"].as_str().unwrap_or("");
            joined[i]["function"]["arguments"] = json!(args);
        }
    }
    assert_eq!(cities(&joined), ["Paris", "London"], "{body}");
    assert_eq!(deltas.last().unwrap()["finish_reason"], "length", "{body}");
}

/// A framed family (Qwen3-Coder's tagged arguments, from its real template)
/// on the server: the calls whole and streamed are the same, each value of
/// its schema's type (`days` an integer, written as text), and an answer
/// cut inside its second call keeps the first, whole and streamed.
#[test]
fn a_framed_familys_calls_read_the_same_whole_and_streamed() {
    let model = tool_model_path().display().to_string();
    let t = common::run::real_template("Qwen3-Coder.jinja");
    let served = Served::start(&["-m", &model, "--chat-template", &t], &[]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}]);
    for (max_tokens, finish, cities) in [
        (60, "length", vec!["Paris"]),
        (200, "tool_calls", vec!["Paris", "London", "Tokyo"]),
    ] {
        let request = json!({"messages": [{"role": "user",
            "content": "What is the weather in Paris, London and Tokyo?"}],
            "tools": tools, "tool_choice": "required", "temperature": 0, "max_tokens": max_tokens});
        let body = chat(&served, &request);
        let v: Value = serde_json::from_str(&body).unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], finish, "{v}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        let args: Vec<Value> = calls
            .iter()
            .map(|c| serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap())
            .collect();
        let named: Vec<&str> = args.iter().map(|a| a["city"].as_str().unwrap()).collect();
        assert_eq!(named, cities, "{v}");
        assert!(args[0]["days"].is_u64(), "{v}");
        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        let body = chat(&served, &streamed);
        let chunks = events(&body);
        let mut joined: Vec<(String, String)> = Vec::new();
        for part in chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
        {
            let i = part["index"].as_u64().unwrap() as usize;
            if i == joined.len() {
                joined.push(Default::default());
            }
            if let Some(name) = part["function"]["name"].as_str() {
                joined[i].0 = name.to_string();
            }
            joined[i].1 += part["function"]["arguments"].as_str().unwrap_or("");
        }
        let whole: Vec<(String, String)> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                (
                    f["name"].as_str().unwrap().into(),
                    f["arguments"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(joined, whole, "{body}");
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(
            Some(content.as_str()).filter(|c| !c.is_empty()),
            choice["message"]["content"].as_str(),
            "{body}"
        );
        let last = chunks
            .iter()
            .rev()
            .find(|c| !c["choices"][0]["finish_reason"].is_null());
        assert_eq!(
            last.unwrap()["choices"][0]["finish_reason"],
            finish,
            "{body}"
        );
    }
}

#[test]
fn gpt_oss_calls_and_words_keep_to_their_channels_whole_and_streamed() {
    // gpt-oss's harmony: the thought on the analysis channel, then a call
    // on the commentary channel or words on the final one, whose header
    // and end of message are not the content's.
    let model = tool_model_path().display().to_string();
    let t = common::run::real_template("openai-gpt-oss-120b.jinja");
    let served = Served::start(&["-m", &model, "--chat-template", &t], &[]);
    // The tool model writes the commentary channel wherever it may; with
    // "comment" (its token 6182) biased away it takes the final one.
    let cases = [
        (
            json!({"tool_choice": "required"}),
            "tool_calls",
            r#"{"city":"Paris","unit":"celsius"}"#,
        ),
        (
            json!({"tool_choice": "auto", "logit_bias": {"6182": -100}}),
            "stop",
            "The weather in Paris is currently",
        ),
    ];
    for (extra, finish, said) in cases {
        let mut request = json!({"messages": [{"role": "user",
            "content": "What is the weather in Paris?"}], "tools": weather(),
            "temperature": 0, "max_tokens": 60, "reasoning_budget": 6});
        for (k, v) in extra.as_object().unwrap() {
            request[k] = v.clone();
        }
        let body = chat(&served, &request);
        let v: Value = serde_json::from_str(&body).unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], finish, "{v}");
        let message = &choice["message"];
        let reasoning = message["reasoning_content"].as_str().unwrap();
        assert_eq!(reasoning, "The weather in Paris is currently", "{v}");
        let call = &message["tool_calls"][0]["function"];
        let answer = match finish {
            "tool_calls" => call["arguments"].as_str().unwrap(),
            _ => message["content"].as_str().unwrap(),
        };
        assert_eq!(answer, said, "{v}");
        // Streamed, the same reasoning, call and words.
        request["stream"] = json!(true);
        let body = chat(&served, &request);
        let deltas: Vec<Value> = events(&body)
            .into_iter()
            .map(|c| c["choices"][0]["delta"].clone())
            .collect();
        let joined =
            |key: &str| -> String { deltas.iter().filter_map(|d| d[key].as_str()).collect() };
        assert_eq!(joined("reasoning_content"), reasoning, "{body}");
        let arguments: String = deltas
            .iter()
            .filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        let streamed = match finish {
            "tool_calls" => arguments,
            _ => joined("content"),
        };
        assert_eq!(streamed, answer, "{body}");
    }
}
