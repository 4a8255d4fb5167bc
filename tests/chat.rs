//! Instruct models in one line: `--chat` renders the prompt through the
//! model's chat template exactly as Hugging Face's Jinja does (checked
//! against Python's jinja2 with transformers' settings), on every face.

use crate::common;
use common::run::{cmpl, second_model_path};
use common::schema::assert_valid;
use common::served::Served;
use serde_json::{json, Value};
use std::path::PathBuf;

const QUESTION: &str = "Name the capital city of France.";

fn smol() -> String {
    second_model_path().display().to_string()
}

fn template(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/templates")
        .join(name)
        .display()
        .to_string()
}

/// What `transformers` renders for `messages` with `template` (a file, or
/// the model's own for `None`), by tests/chat_reference.py.
fn reference(model: &str, template: Option<&str>, messages: &Value) -> String {
    reference_with(model, template, messages, None).unwrap_or_else(|e| panic!("{e}"))
}

/// The same, with `tools` offered; `Err` where jinja2 fails on the template.
fn reference_with(
    model: &str,
    template: Option<&str>,
    messages: &Value,
    tools: Option<&Value>,
) -> Result<String, String> {
    let python = common::sdk::sdk_python_path();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chat_reference.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args([model, template.unwrap_or("-"), &messages.to_string()])
        .args(tools.map(Value::to_string))
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8(out.stdout).unwrap()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The prompt as cmpl rendered it (`--echo`), and the response.
fn echoed(args: &[&str], stdin: Option<&str>) -> (String, Value) {
    let mut all = vec![
        "--echo",
        "--max-tokens",
        "1",
        "--temperature",
        "0",
        "--json",
    ];
    all.extend_from_slice(args);
    let mut run = cmpl(&all);
    if let Some(text) = stdin {
        run = run.stdin(text);
    }
    let v = run.run().json();
    assert_valid("CompletionResponse", &v);
    (v["prompt"][0]["text"].as_str().unwrap().to_string(), v)
}

#[test]
fn the_models_own_template_renders_as_jinja_renders_it() {
    let model = smol();
    let cases: [(&[&str], Option<&str>, Value); 3] = [
        (
            &[QUESTION],
            None,
            json!([{"role": "user", "content": QUESTION}]),
        ),
        (
            &["--system", "You answer in one word.", QUESTION],
            None,
            json!([{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": QUESTION}]),
        ),
        // Piped text and PROMPT make one user message, as without --chat.
        (
            &["Summarize the notes above."],
            Some("Notes: the meeting moved to Tuesday.\n"),
            json!([{"role": "user", "content": "Notes: the meeting moved to Tuesday.\n\nSummarize the notes above."}]),
        ),
    ];
    for (args, stdin, messages) in cases {
        let mut with_model = vec!["-m", &model, "--chat"];
        with_model.extend_from_slice(args);
        let (prompt, _) = echoed(&with_model, stdin);
        // The user's text is exactly the prompt cmpl takes without --chat.
        let mut plain = vec!["-m", &model];
        plain.extend(
            args.iter()
                .filter(|a| !a.starts_with("--system") && **a != "You answer in one word."),
        );
        let (raw, _) = echoed(&plain, stdin);
        assert_eq!(messages.as_array().unwrap().last().unwrap()["content"], raw);
        assert_eq!(prompt, reference(&model, None, &messages), "{args:?}");
        assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    }
}

#[test]
fn other_families_templates_render_as_jinja_renders_them() {
    // Llama 3 headers, Mistral's [INST], Gemma's turns: given with
    // --chat-template on the test model (a base model: its BOS is <bos>).
    let model = common::run::model_path().display().to_string();
    for name in [
        "llama3.jinja",
        "mistral.jinja",
        "gemma.jinja",
        "chatml.jinja",
    ] {
        let file = template(name);
        let (prompt, _) = echoed(&["--chat-template", &file, QUESTION], None);
        let messages = json!([{"role": "user", "content": QUESTION}]);
        assert_eq!(prompt, reference(&model, Some(&file), &messages), "{name}");
        if name == "mistral.jinja" {
            continue;
        }
        let (prompt, _) = echoed(
            &["--chat-template", &file, "--system", "Be brief.", QUESTION],
            None,
        );
        let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]);
        assert_eq!(prompt, reference(&model, Some(&file), &messages), "{name}");
    }
    // One BOS: the template writes it, and the tokenizer adds none again.
    let (_, v) = echoed(
        &[
            "--chat-template",
            &template("gemma.jinja"),
            "--logprobs",
            "0",
            QUESTION,
        ],
        None,
    );
    let tokens = v["prompt"][0]["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(tokens[0], "<bos>");
    assert_ne!(tokens[1], "<bos>");
    // A template's own refusal is the request's error, in its words.
    cmpl(&[
        "--chat-template",
        &template("mistral.jinja"),
        "--system",
        "x",
        QUESTION,
    ])
    .run()
    .fails(2, "Conversation roles must alternate");
}

#[test]
fn a_question_is_answered_and_ends_at_its_turn() {
    let model = smol();
    let out = cmpl(&[
        "-m",
        &model,
        "--chat",
        QUESTION,
        "--temperature",
        "0",
        "--max-tokens",
        "64",
        "--json",
    ])
    .run();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    assert!(
        !text.contains("<|im_end|>") && !text.contains("<|im_start|>"),
        "{text:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    // Text mode prints the same answer.
    let plain = cmpl(&[
        "-m",
        &model,
        "--chat",
        QUESTION,
        "--temperature",
        "0",
        "--max-tokens",
        "64",
    ])
    .run();
    assert_eq!(plain.ok(), format!("{text}"));
    // A model writing the end of turn as text stops there too (ChatML on
    // the test model, where <|im_end|> is no token of its own).
    let v = cmpl(&[
        "--chat-template",
        &template("chatml.jinja"),
        QUESTION,
        "--temperature",
        "0",
        "--max-tokens",
        "200",
        "--json",
    ])
    .run()
    .json();
    assert!(
        !v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .contains("<|im_end|>"),
        "{v}"
    );
}

#[test]
fn a_model_without_a_template_names_the_fix() {
    let out = cmpl(&["--chat", QUESTION]).run();
    out.fails(2, "--chat-template");
    let v = cmpl(&["--chat", QUESTION, "--json"]).run();
    assert_eq!(v.code, 2);
    assert_eq!(v.json()["error"]["param"], "chat_template", "{}", v.stdout);
    cmpl(&["--chat-template", "/nonexistent/t.jinja", QUESTION])
        .run()
        .fails(2, "/nonexistent/t.jinja");
    let broken = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(broken.path(), "{% for %}").unwrap();
    cmpl(&[
        "--chat-template",
        &broken.path().display().to_string(),
        QUESTION,
    ])
    .run()
    .fails(2, "not valid Jinja");
    cmpl(&["--chat=false", "--system", "x", QUESTION])
        .run()
        .fails(2, "`system` applies to a chat");
}

#[test]
fn every_face_chooses_chat_the_same_way() {
    let model = smol();
    let args = [
        "-m",
        model.as_str(),
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--json",
    ];
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let flag = text(&cmpl(&args).args(["--chat", QUESTION]).run().json());
    let raw = text(&cmpl(&args).args([QUESTION]).run().json());
    assert_ne!(flag, raw);
    // A JSON request's "chat" (and "system"), the environment, the config.
    let piped = cmpl(&args)
        .stdin(json!({"prompt": QUESTION, "chat": true}).to_string())
        .run()
        .json();
    assert_eq!(text(&piped), flag);
    let env = cmpl(&args)
        .args([QUESTION])
        .env("CMPL_CHAT", "1")
        .run()
        .json();
    assert_eq!(text(&env), flag);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), r#"{"chat": true}"#).unwrap();
    let configured = cmpl(&args)
        .args([QUESTION])
        .env("CMPL_CONFIG", config.path())
        .run()
        .json();
    assert_eq!(text(&configured), flag);
    // Flags win: --chat=false over the environment.
    let off = cmpl(&args)
        .args(["--chat=false", QUESTION])
        .env("CMPL_CHAT", "1")
        .run()
        .json();
    assert_eq!(text(&off), raw);
    // --batch lines choose per line, echo showing each line's prompt.
    let lines = format!(
        "{}\n{}\n",
        json!({"prompt": QUESTION, "chat": true, "echo": true}),
        json!({"prompt": QUESTION})
    );
    let out = cmpl(&[
        "-m",
        &model,
        "--batch",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
    ])
    .stdin(lines)
    .run();
    let answers: Vec<Value> = out
        .ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(text(&answers[0]), flag);
    assert_eq!(text(&answers[1]), raw);
    assert!(answers[0]["prompt"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("<|im_start|>"));
    // A resident (in a runtime folder of this test's own) answers as the
    // one-shot does.
    let runtime = tempfile::tempdir().unwrap();
    let resident = |extra: &[&str]| {
        cmpl(&args)
            .args(extra)
            .env("XDG_RUNTIME_DIR", runtime.path())
            .run()
    };
    let warm = resident(&["--chat", QUESTION, "--keep-alive", "1m"]).json();
    assert_eq!(text(&warm), flag);
    let again = resident(&["--chat", QUESTION, "--keep-alive", "1m"]).json();
    assert_eq!(text(&again), flag);
    cmpl(&["--stop-resident", "all"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .run()
        .ok();
}

#[test]
fn the_servers_chat_endpoint_serves_the_clients() {
    // The OpenAI SDK, LangChain's ChatOpenAI and `llm` (tests/chat_clients.py)
    // get the command line's own answer, plain and streamed.
    let model = smol();
    let answer = cmpl(&[
        "-m",
        &model,
        "--chat",
        QUESTION,
        "--temperature",
        "0",
        "--max-tokens",
        "64",
    ])
    .run()
    .ok()
    .to_string();
    let server = Served::start(&["-m", &model], &[]);
    common::sdk::python_script("chat_clients.py", &[&server.root(), &answer]);
}

#[test]
fn a_remote_engine_is_sent_the_rendered_prompt() {
    // Rendered here with --chat-template (a server's model's own template
    // cannot be read from here): the server answers as the model would.
    let model = smol();
    let file = template("chatml.jinja");
    let args = [
        "--chat-template",
        &file,
        QUESTION,
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--json",
    ];
    let local = cmpl(&["-m", &model]).args(args).run().json();
    let server = Served::start(&["-m", &model], &[]);
    let remote = cmpl(&["--base-url", &server.url()])
        .args(args)
        .args(["--echo"])
        .run();
    let v = remote.json();
    assert_eq!(
        v["choices"][0]["text"], local["choices"][0]["text"],
        "{}",
        remote.stderr
    );
    assert!(
        v["prompt"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("<|im_start|>system"),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    cmpl(&["--base-url", &server.url(), "--chat", QUESTION])
        .run()
        .fails(2, "--chat-template FILE");
}

/// Every template in llama.cpp's collection, given tools and a conversation
/// that called one and had its answer, renders as transformers renders it
/// (the reasoning's opening that cmpl adds aside), or is refused where it
/// never reads `tools`; where jinja2 itself fails on it, cmpl fails cleanly.
/// The last line of the tools DeepSeek's family shows in a system message.
const SHOWN_END: &str = "chain them directly without separators or spaces\n";

#[test]
fn the_collections_templates_render_tools_and_calls_as_jinja_does() {
    let model = common::run::model_path().display().to_string();
    let dir =
        std::env::var_os("CMPL_TEMPLATES").expect("CMPL_TEMPLATES is not set: run scripts/test");
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    // Arguments as objects, as cmpl hands them to templates (the API sends
    // JSON text); an id Mistral's templates take; content "" where the API
    // sends null, as cmpl passes it.
    let call = |arguments: Value| {
        json!([{"id": "a1b2c3d4e", "type": "function",
        "function": {"name": "get_weather", "arguments": arguments}}])
    };
    let conversation = |content: Value, arguments: Value| {
        json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": call(arguments)},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "21 C"}])
    };
    let for_reference = conversation(json!(""), json!({"city": "Paris"}));
    let body = json!({"messages": conversation(Value::Null, json!("{\"city\": \"Paris\"}")),
        "tools": tools, "tool_choice": "none", "max_tokens": 1, "temperature": 0, "echo": true});
    // Where cmpl leaves a jinja2 quirk aside: markupsafe escaping the JSON
    // that functionary 3.1 joins to `|safe` text (`&#34;`).
    let known = ["meetkai-functionary-medium-v3.1.jinja"];
    let openings = ["", "<think>\n", "[THINK]", "<|channel|>analysis<|message|>"];
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    names.sort();
    assert!(names.len() > 40, "{names:?}");
    // Every template through one batch and one reference run: the model
    // is loaded (and its vocabulary read) once, not once a template.
    let lines: Vec<String> = names
        .iter()
        .map(|path| {
            let mut line = body.clone();
            line["chat_template"] = json!(std::fs::read_to_string(path).unwrap());
            line.to_string()
        })
        .collect();
    let out = cmpl(&["-m", &model, "--batch"])
        .stdin(lines.join("\n"))
        .run();
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    let answers: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), names.len(), "{}", out.stderr);
    let list = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(list.path(), json!(names).to_string()).unwrap();
    let at = format!("@{}", list.path().display());
    let wants: Vec<Value> = serde_json::from_str(
        &reference_with(&model, Some(&at), &for_reference, Some(&tools)).unwrap(),
    )
    .unwrap();
    let mut same = 0;
    for ((path, v), want) in names.iter().zip(&answers).zip(&wants) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let t = path.display().to_string();
        let error = v["error"]["message"].as_str();
        let Some(want) = want["text"].as_str() else {
            // jinja2 fails on it: cmpl refuses it (or answers), never panics.
            continue;
        };
        if error.is_some_and(|e| e.contains("the chat template ignores `tools`")) {
            let without = reference_with(&model, Some(&t), &for_reference, None);
            assert_eq!(without.as_deref(), Ok(want), "{name} reads tools");
            continue;
        }
        let got = v["prompt"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {v}"));
        if known.contains(&name.as_str()) {
            continue;
        }
        // A template that shows no tools, of a family that shows them
        // itself in the system message (DeepSeek V3.1): the rest is jinja2's.
        let shown = got.find("## Tools\n").zip(got.find(SHOWN_END));
        let got = match shown {
            Some((from, to)) => format!("{}{}", &got[..from], &got[to + SHOWN_END.len()..]),
            None => got.to_string(),
        };
        let added = got.strip_prefix(want);
        assert!(
            added.is_some_and(|a| openings.contains(&a)),
            "{name}:\ncmpl: {got:?}\njinja2: {want:?}"
        );
        same += 1;
    }
    assert!(same >= 40, "only {same} templates rendered as jinja2 does");
}
