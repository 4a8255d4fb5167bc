//! `cmpl --serve`: the API on 127.0.0.1, answered by the test model, read by
//! real clients (the official SDKs, cmpl --base-url, plain HTTP).

use crate::common;
use common::run::cmpl;
use common::schema::assert_valid;
use common::sdk::python_script;
use common::served::Served;
use serde_json::{json, Value};

const FRANCE: &str = "The capital of France is";

/// The response without what differs per run.
fn stable(mut v: Value) -> Value {
    for key in ["id", "created"] {
        v.as_object_mut().unwrap().remove(key);
    }
    v
}

#[test]
fn answers_exactly_what_the_command_line_prints() {
    let server = Served::start(&[], &[]);
    // Several choices: the server copies the prompt's cells to each choice's
    // own slot, the command line shares them; the answers are the same.
    for request in [
        json!({"prompt": FRANCE, "max_tokens": 12, "temperature": 0, "seed": 4, "logprobs": 2, "echo": true}),
        json!({"prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0, "seed": 4, "logprobs": 2, "echo": true}),
        json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0.9, "seed": 7, "n": 3, "logprobs": 1, "echo": true}),
        json!({"prompt": FRANCE, "max_tokens": 10, "temperature": 0.7, "seed": 2, "n": 2}),
    ] {
        let (status, body) = server.post(&request.to_string());
        assert_eq!(status, 200, "{body}");
        let served: Value = serde_json::from_str(&body).unwrap();
        assert_valid("CompletionResponse", &served);
        let local = cmpl(&["--json"]).stdin(request.to_string()).run();
        assert_eq!(stable(served), stable(local.json()), "{request}");
    }
    // A stream: the same events as --stream --json.
    let request =
        json!({"prompt": FRANCE, "max_tokens": 6, "temperature": 0, "seed": 4, "stream": true});
    let (status, body) = server.post(&request.to_string());
    assert_eq!(status, 200);
    let local = cmpl(&["--json"]).stdin(request.to_string()).run();
    let events = |text: &str| -> Vec<Value> {
        text.split_terminator("\n\n")
            .map(|e| e.strip_prefix("data: ").unwrap())
            .filter(|d| *d != "[DONE]")
            .map(|d| stable(serde_json::from_str(d).unwrap()))
            .collect()
    };
    assert!(body.ends_with("data: [DONE]\n\n"));
    for e in body.split_terminator("\n\n") {
        let data = e.strip_prefix("data: ").unwrap();
        if data != "[DONE]" {
            assert_valid("CompletionChunk", &serde_json::from_str(data).unwrap());
        }
    }
    assert_eq!(events(&body), events(&local.stdout));
    // And through the remote backend, the loop closes.
    let remote = cmpl(&[
        FRANCE,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--base-url",
        &server.url(),
    ])
    .run();
    let local = cmpl(&[FRANCE, "--max-tokens", "24", "--temperature", "0"]).run();
    assert_eq!(remote.ok(), local.ok());
    // One short log line per request.
    let log = server.log_when(|l| l.contains("POST /v1/completions 200 12 tokens"));
    assert!(log.contains("POST /v1/completions 200 12 tokens"), "{log}");
}

/// The command line's greedy answers to FRANCE on this machine (6 tokens;
/// 30 with stop "."), which the SDK scripts hold the server to.
fn france_answers() -> (String, String) {
    let six = cmpl(&[FRANCE, "--max-tokens", "6", "--temperature", "0"]).run();
    let stop = cmpl(&[
        FRANCE,
        "--max-tokens",
        "30",
        "--temperature",
        "0",
        "--stop",
        ".",
    ])
    .run();
    (six.ok().to_string(), stop.ok().to_string())
}

#[test]
fn the_official_sdks_run_unchanged() {
    let server = Served::start(&[], &[]);
    let (six, stop) = france_answers();
    let root = server.root();
    python_script(
        "sdk_server.py",
        &[&root, "gemma-3-270m-q4_k_m.gguf", &six, &stop],
    );
}

#[test]
fn clients_in_the_wild_run_unchanged() {
    // The OpenAI SDK's own options, LangChain's completion model and the
    // `llm` tool (tests/wild_clients.py; scripts/test installs them).
    let server = Served::start(&["--parallel", "4"], &[]);
    let (six, stop) = france_answers();
    python_script("wild_clients.py", &[&server.root(), &six, &stop]);
}

#[test]
fn a_list_of_prompts_is_answered_in_order() {
    let server = Served::start(&["--parallel", "4"], &[]);
    let each = |prompt: &str| {
        let (status, body) = server.post(
            &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "n": 2}).to_string(),
        );
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let (a, b) = (each(FRANCE), each("1, 2, 3,"));
    let (status, body) = server.post(
        &json!({"prompt": [FRANCE, "1, 2, 3,"], "max_tokens": 6, "temperature": 0, "n": 2})
            .to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let both: Value = serde_json::from_str(&body).unwrap();
    assert_valid("CompletionResponse", &both);
    let choices = both["choices"].as_array().unwrap();
    let texts: Vec<&Value> = choices.iter().map(|c| &c["text"]).collect();
    let want: Vec<&Value> = [&a, &b]
        .iter()
        .flat_map(|r| r["choices"].as_array().unwrap().iter().map(|c| &c["text"]))
        .collect();
    assert_eq!(texts, want);
    let indexes: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 2, 3]);
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(
            both["usage"][key].as_u64().unwrap(),
            a["usage"][key].as_u64().unwrap() + b["usage"][key].as_u64().unwrap()
        );
    }
    // A list past the queue (8 places per slot, 32 here) is refused at once.
    let many: Vec<&str> = vec!["a"; 33];
    let (status, body) = server.post(&json!({"prompt": many}).to_string());
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["param"], "prompt");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 32"),
        "{body}"
    );
    // Streamed, a list is refused by name; so is a list on the command line.
    let (status, body) = server.post(&json!({"prompt": ["a", "b"], "stream": true}).to_string());
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["param"],
        "prompt"
    );
    let out = cmpl(&["--json"]).stdin(r#"{"prompt": ["a", "b"]}"#).run();
    out.fails(2, "give each its own line with --batch");
}

#[test]
fn concurrent_clients_each_get_their_own_answer() {
    let server = Served::start(&["--parallel", "8"], &[]);
    let server = &server;
    // The greedy half follows its single runs as batch lines do.
    let greedy = |i: usize| {
        json!({"prompt": format!("Question {}: what is {} + {}?", i % 8, i % 8, i % 8),
               "max_tokens": 8, "temperature": 0, "logprobs": 5})
    };
    let alone: Vec<Value> = (0..8)
        .map(|i| {
            cmpl(&["--request", "-"])
                .stdin(greedy(i).to_string())
                .run()
                .json()
        })
        .collect();
    let alone = &alone;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                s.spawn(move || {
                    let prompt = format!("Question {i}: what is {i} + {i}?");
                    let stream = i % 2 == 0;
                    if i % 4 == 1 {
                        let (status, body) = server.post(&greedy(i).to_string());
                        assert_eq!(status, 200, "{body}");
                        let v: Value = serde_json::from_str(&body).unwrap();
                        common::schema::follows_single_run(&v, &alone[i % 8]);
                        return;
                    }
                    let request = json!({"prompt": prompt, "max_tokens": 8, "echo": true, "stream": stream, "seed": i});
                    let (status, body) = server.post(&request.to_string());
                    assert_eq!(status, 200, "{body}");
                    if stream {
                        let chunks: Vec<Value> = body
                            .split_terminator("\n\n")
                            .map(|e| e.strip_prefix("data: ").unwrap())
                            .filter(|d| *d != "[DONE]")
                            .map(|d| serde_json::from_str(d).unwrap())
                            .collect();
                        let last = chunks.last().unwrap();
                        assert_eq!(last["usage"]["completion_tokens"].as_u64().unwrap(), 8);
                        assert!(chunks.iter().all(|c| c["seed"] == i), "its own seed");
                    } else {
                        let v: Value = serde_json::from_str(&body).unwrap();
                        assert_valid("CompletionResponse", &v);
                        assert_eq!(v["prompt"][0]["text"], prompt, "its own prompt");
                        assert_eq!(v["choices"][0]["seed"], i);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn a_client_that_leaves_frees_its_slot() {
    use std::io::{Read, Write};
    let server = Served::start(&["--parallel", "1"], &[]);
    let body = json!({"prompt": "1, 2, 3,", "max_tokens": 4000, "temperature": 0, "stream": true})
        .to_string();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    assert!(conn.read(&mut first).unwrap() > 0, "the stream started");
    drop(conn);
    // The only slot is free again: a request that needs it is answered.
    let started = std::time::Instant::now();
    let (status, text) = server.post(&json!({"prompt": "Hi", "max_tokens": 2}).to_string());
    assert_eq!(status, 200, "{text}");
    assert!(started.elapsed().as_secs() < 30, "not after 4000 tokens");
    let log = server.log_when(|l| l.contains(" 499 "));
    assert!(
        log.contains(" 499 "),
        "the cancelled request is logged: {log}"
    );
}

#[test]
fn each_slot_holds_its_share_of_the_context() {
    // 512 cells over 2 slots: 256 for each choice, its prompt included.
    let server = Served::start(&["--parallel", "2", "-c", "512"], &[]);
    let request = json!({"prompt": "1, 2, 3,", "max_tokens": 1000, "temperature": 0, "n": 2});
    let (status, body) = server.post(&request.to_string());
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["usage"]["total_tokens"],
        2 * 256 - v["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{body}"
    );
    for choice in v["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "length");
    }
    let long = "one two three four five six seven eight nine ten ".repeat(30);
    let (status, body) = server.post(&json!({"prompt": long, "max_tokens": 4}).to_string());
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["param"], "prompt");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tokens and a slot (--ctx-size over --parallel) holds 256, which leaves no room to generate; shorten the prompt or raise --ctx-size"),
        "{message}"
    );
}

#[test]
fn bad_requests_get_the_apis_statuses_and_the_server_goes_on() {
    let server = Served::start(&[], &[]);
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        ("POST", "/v1/completions", "{\"prompt\": ", 400, "request"),
        (
            "POST",
            "/v1/completions",
            "{\"prompt\": \"hi\", \"n\": \"two\"}",
            400,
            "n",
        ),
        (
            "POST",
            "/v1/completions",
            "{\"prompt\": \"hi\", \"bogus\": 1}",
            400,
            "bogus",
        ),
        ("POST", "/v1/nothing", "{}", 404, "path"),
        ("PUT", "/v1/completions", "{}", 405, "method"),
        // More choices than the server's slots: refused at once, naming n.
        (
            "POST",
            "/v1/completions",
            "{\"prompt\": \"hi\", \"n\": 100}",
            400,
            "n",
        ),
    ];
    for (method, path, body, status, param) in cases {
        let (got, text) = server.send(method, path, body, None);
        assert_eq!(got, *status, "{method} {path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_valid("ErrorData", &v);
        let want = if *param == "-" {
            Value::Null
        } else {
            json!(param)
        };
        assert_eq!(v["error"]["param"], want, "{text}");
    }
    // One log line per request refused.
    let log = server.log_when(|l| l.matches("POST /v1/completions 400").count() >= 4);
    assert_eq!(log.matches("POST /v1/completions 400").count(), 4, "{log}");
    // A body over the limit: 413, whatever the client does with the rest.
    {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let len = 9 << 20;
        let _ = write!(
            conn,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n"
        );
        let chunk = vec![b'a'; 1 << 16];
        for _ in 0..(len / chunk.len()) {
            if conn.write_all(&chunk).is_err() {
                break;
            }
        }
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer:.200}");
    }
    let (status, text) = server.send("GET", "/v1/models", "", None);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert!(models["data"][0]["id"]
        .as_str()
        .unwrap()
        .ends_with("gemma-3-270m-q4_k_m.gguf"));
    assert_eq!(
        server
            .post(&json!({"prompt": "Hi", "max_tokens": 1}).to_string())
            .0,
        200
    );
}

#[test]
fn keys_and_addresses() {
    // Another address without a key: refused, and why.
    let out = cmpl(&["--serve", "0.0.0.0:0"]).run();
    out.fails(2, "needs an API key");
    let server = Served::start(&[], &[("CMPL_API_KEY", "sk-serve")]);
    let body = json!({"prompt": "Hi", "max_tokens": 1}).to_string();
    for key in [None, Some("wrong")] {
        let (status, text) = server.send("POST", "/v1/completions", &body, key);
        assert_eq!(status, 401, "{text}");
        assert_valid("ErrorData", &serde_json::from_str(&text).unwrap());
    }
    // The scheme's name is case-insensitive in HTTP.
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let (status, text) = server.send_with(
            "POST",
            "/v1/completions",
            &body,
            &[("Authorization", &format!("{scheme} sk-serve"))],
        );
        assert_eq!(status, 200, "{scheme}: {text}");
    }
    assert_eq!(
        server
            .send("POST", "/v1/completions", &body, Some("sk-serve"))
            .0,
        200
    );
    assert_eq!(
        server.send("GET", "/health", "", None).0,
        200,
        "health needs no key"
    );
    // With --strict-model, another model's name is a 404.
    let strict = Served::start(&["--strict-model"], &[]);
    let (status, text) = strict.post(&json!({"prompt": "Hi", "model": "other"}).to_string());
    assert_eq!(status, 404, "{text}");
}

#[test]
fn sigterm_finishes_the_streams_in_flight() {
    let mut server = Served::start(&[], &[]);
    let url = server.url();
    let client = std::thread::spawn(move || {
        cmpl(&[
            "1, 2, 3,",
            "--max-tokens",
            "200",
            "--temperature",
            "0",
            "--stream",
            "--json",
            "--base-url",
            &url,
        ])
        .run()
    });
    // Once the stream is in flight (a busy machine may take its time to
    // start the client).
    server.wait_metric("vllm:num_requests_running", |n| n == 1.0);
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let out = client.join().unwrap();
    out.ok();
    let chunks = out.sse();
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        200,
        "finished, not cut"
    );
    assert_eq!(server.child.wait().unwrap().code(), Some(0));
}
