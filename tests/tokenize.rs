//! The model's tokenizer: `cmpl --tokenize` on the command line, and a
//! server's `/tokenize`, `/detokenize` and `/tokenizer_info` (vLLM's shapes,
//! and llama-server's where a body asks in them), round trips equal to the
//! CLI's tokenization and to what a completion counts as its prompt.

use crate::common;
use common::run::{cmpl, second_model_path};
use common::served::Served;
use serde_json::{json, Value};

const FRANCE: &str = "The capital of France is";

fn ids(value: &Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

fn post(server: &Served, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = server.send("POST", path, &body.to_string(), None);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, v)
}

#[test]
fn the_command_line_prints_the_ids_a_prompt_is_read_as() {
    let plain = cmpl(&["--tokenize", FRANCE]).run();
    let words: Vec<i64> = plain
        .ok()
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    let json = cmpl(&["--tokenize", FRANCE, "--json"]).run().json();
    assert_eq!(ids(&json["tokens"]), words);
    assert_eq!(json["count"], words.len());
    // The ids a completion of the same prompt counts (BOS included).
    let answer = cmpl(&["--json", FRANCE, "--max-tokens", "1", "--temperature", "0"])
        .run()
        .json();
    assert_eq!(answer["usage"]["prompt_tokens"], words.len());
    assert_eq!(words[0], 2, "Gemma's <bos> first");
    // From stdin too.
    let piped = cmpl(&["--tokenize", "-"]).stdin(FRANCE).run();
    assert_eq!(piped.ok(), plain.ok());
    // Not beside a prompt.
    cmpl(&["--tokenize", FRANCE, "Hello"])
        .run()
        .fails(2, "cannot be used with");
}

#[test]
fn a_server_tokenizes_and_detokenizes_as_vllm_and_llama_server_do() {
    let server = Served::start(&[], &[]);
    let cli: Vec<i64> = cmpl(&["--tokenize", FRANCE])
        .run()
        .ok()
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    // vLLM's shape: BOS by default, as a prompt is read.
    let (status, v) = post(&server, "/tokenize", &json!({"prompt": FRANCE}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(ids(&v["tokens"]), cli);
    assert_eq!(v["count"], cli.len());
    assert_eq!(v["max_model_len"], 32768);
    let (_, bare) = post(
        &server,
        "/tokenize",
        &json!({"prompt": FRANCE, "add_special_tokens": false}),
    );
    assert_eq!(ids(&bare["tokens"]), cli[1..]);
    // Back to the text, in both servers' names.
    let (status, text) = post(&server, "/detokenize", &json!({"tokens": &cli[1..]}));
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        (&text["prompt"], &text["content"]),
        (&json!(FRANCE), &json!(FRANCE))
    );
    let (_, with_bos) = post(&server, "/v1/detokenize", &json!({"tokens": cli}));
    assert_eq!(with_bos["prompt"], format!("<bos>{FRANCE}"));
    // llama-server's shape: no BOS unless asked, pieces on request.
    let (_, llama) = post(&server, "/tokenize", &json!({"content": FRANCE}));
    assert_eq!(ids(&llama["tokens"]), cli[1..]);
    let (_, pieces) = post(
        &server,
        "/tokenize",
        &json!({"content": "The capital", "with_pieces": true, "add_special": true}),
    );
    assert_eq!(pieces["tokens"][0], json!({"id": 2, "piece": "<bos>"}));
    assert_eq!(pieces["tokens"][1]["piece"], "The");
    // What a harness reads of the vocabulary.
    let (status, info) = server.send("GET", "/tokenizer_info", "", None);
    assert_eq!(status, 200);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["bos_token"], "<bos>");
    assert_eq!(info["eos_token"], "<eos>");
    assert_eq!(info["model_max_length"], 32768);
    assert_eq!(info["vocab_size"], 262144);
}

#[test]
fn bad_tokenizer_bodies_are_refused_by_field() {
    let server = Served::start(&[], &[]);
    for (path, body, param, message) in [
        (
            "/detokenize",
            json!({"tokens": [2, 999999999]}),
            "tokens",
            "`tokens[1]` is 999999999, and this model's vocabulary has ids 0 to 262143",
        ),
        (
            "/detokenize",
            json!({"tokens": [2, "x"]}),
            "tokens",
            "`tokens[1]` must be an integer token id",
        ),
        (
            "/tokenize",
            json!({"text": FRANCE}),
            "prompt",
            "give `prompt` (text) or `messages` (a chat), or llama-server's `content`",
        ),
        (
            "/tokenize",
            json!({"prompt": 7}),
            "prompt",
            "`prompt` must be a string",
        ),
    ] {
        let (status, v) = post(&server, path, &body);
        assert_eq!(status, 400, "{v}");
        assert_eq!(
            (&v["error"]["param"], &v["error"]["message"]),
            (&json!(param), &json!(message)),
            "{body}"
        );
    }
    // A text surely past the model's context is refused by its length.
    let huge = "word ".repeat(1_600_000);
    let (status, v) = post(&server, "/tokenize", &json!({ "prompt": huge }));
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("past the model's context of 32768"),
        "{v}"
    );
    // GET is refused on the POST routes, and the routes want the key.
    let (status, _) = server.send("GET", "/tokenize", "", None);
    assert_eq!(status, 405);
    drop(server);
    let keyed = Served::start(&[], &[("CMPL_API_KEY", "sesame")]);
    let (status, _) = keyed.send("POST", "/tokenize", r#"{"prompt": "a"}"#, None);
    assert_eq!(status, 401);
    let (status, _) = keyed.send("POST", "/tokenize", r#"{"prompt": "a"}"#, Some("sesame"));
    assert_eq!(status, 200);
}

#[test]
fn a_chat_is_tokenized_as_its_template_renders_it() {
    let model = second_model_path();
    let server = Served::start(&["-m", model.to_str().unwrap()], &[]);
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let (status, v) = post(&server, "/tokenize", &json!({ "messages": messages }));
    assert_eq!(status, 200, "{v}");
    let (_, text) = post(&server, "/detokenize", &json!({"tokens": v["tokens"]}));
    let text = text["prompt"].as_str().unwrap();
    assert!(
        text.contains("<|im_start|>user\nHi<|im_end|>")
            && text.ends_with("<|im_start|>assistant\n"),
        "{text}"
    );
    let (_, info) = server.send("GET", "/tokenizer_info", "", None);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert!(info["chat_template"].as_str().unwrap().contains("im_start"));
}
