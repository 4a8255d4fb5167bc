//! Several models behind one `cmpl --serve` (real weights: Gemma 3 270M,
//! SmolLM2 135M Instruct, Qwen2.5-Coder 0.5B Instruct): each request
//! answered by the model it names, as that model answers alone; a budget
//! that holds one, taken in turns; a corrupt file beside good ones; two
//! models decoding at once; pinning, idling out, loading by hand; the
//! OpenAI SDK listing them and chatting with each.

use crate::common;
use common::run::{cmpl, model_path, second_model_path, tool_model_path, wait_until};
use common::served::Served;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PROMPT: &str = "The capital of France is";

/// The three models, as `-m` flags: Gemma by its file stem, SmolLM2 as
/// `smol`, Qwen by its stem.
fn three() -> Vec<String> {
    let (gemma, smol, qwen) = (model_path(), second_model_path(), tool_model_path());
    vec![
        "-m".into(),
        gemma.display().to_string(),
        "-m".into(),
        format!("smol={}", smol.display()),
        "-m".into(),
        qwen.display().to_string(),
    ]
}

const GEMMA: &str = "gemma-3-270m-q4_k_m";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

fn serve(extra: &[&str]) -> Served {
    let mut args: Vec<String> = three();
    args.extend(["--parallel", "2"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Served::start(&args, &[])
}

/// A model's greedy answer to the prompt run alone (a one-shot).
fn alone(model: &std::path::Path, tokens: u32) -> String {
    alone_with(model, tokens, &[])
}

fn alone_with(model: &std::path::Path, tokens: u32, extra: &[&str]) -> String {
    let model = model.display().to_string();
    let tokens = tokens.to_string();
    let mut args = vec!["-m", &model, PROMPT, "--max-tokens", &tokens];
    args.extend(["--temperature", "0", "--json", "-t", "2"]);
    args.extend(extra);
    let out = cmpl(&args).run();
    out.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

fn ask(s: &Served, model: &str, tokens: u32) -> (u16, Value) {
    s.post_json(
        "/v1/completions",
        &json!({"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}),
    )
}

/// Each model's state, as `GET /v1/models` lists it.
fn states(s: &Served) -> Vec<(String, String)> {
    let (status, text) = s.send("GET", "/v1/models", "", None);
    assert_eq!(status, 200, "{text}");
    let list: Value = serde_json::from_str(&text).unwrap();
    (list["data"].as_array().unwrap().iter())
        .map(|m| {
            let id = m["id"].as_str().unwrap().to_string();
            (id, m["status"]["value"].as_str().unwrap().to_string())
        })
        .collect()
}

fn state_of(s: &Served, model: &str) -> String {
    let states = states(s);
    let found = states.iter().find(|(id, _)| id == model);
    found
        .unwrap_or_else(|| panic!("{model} in {states:?}"))
        .1
        .clone()
}

#[test]
fn alternating_requests_are_answered_by_the_model_they_name() {
    let expected = [
        (GEMMA, alone(&model_path(), 8)),
        ("smol", alone(&second_model_path(), 8)),
        (QWEN, alone(&tool_model_path(), 8)),
    ];
    let s = serve(&[]);
    // Listed before any is asked; none loaded yet.
    let names: Vec<(String, String)> = states(&s);
    assert_eq!(
        names,
        [GEMMA, "smol", QWEN].map(|n| (n.to_string(), "unloaded".to_string()))
    );
    for round in 0..2 {
        for (model, text) in &expected {
            let (status, v) = ask(&s, model, 8);
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["model"], *model);
            assert_eq!(v["choices"][0]["text"], *text, "{model}, round {round}");
        }
    }
    // By its file's stem too; and with no `model`, the first.
    let smol_stem = second_model_path()
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (_, v) = ask(&s, &smol_stem, 8);
    assert_eq!(v["choices"][0]["text"], expected[1].1);
    let (_, v) = s.post_json(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(
        (&v["model"], &v["choices"][0]["text"]),
        (&json!(GEMMA), &json!(expected[0].1))
    );
    // An unknown name: 404 naming the ones there are.
    let (status, v) = ask(&s, "gpt-4", 8);
    assert_eq!(status, 404);
    assert_eq!(v["error"]["param"], "model");
    assert_eq!(
        v["error"]["message"],
        format!("no model `gpt-4` here; this server serves {GEMMA}, smol, {QWEN}")
    );
    assert!(states(&s).iter().all(|(_, state)| state == "loaded"));
    // /metrics by model.
    let (_, metrics) = s.send("GET", "/metrics", "", None);
    assert!(
        metrics.contains("cmpl:model_loaded{model=\"smol\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cmpl:model_requests_total{model=\"smol\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("cmpl:model_requests_total{{model=\"{QWEN}\"}} 2")));
    let log = s.log_when(|l| l.contains(&format!("cmpl: loaded {QWEN}")));
    assert!(
        log.contains("cmpl: loading smol\ncmpl: loaded smol in "),
        "{log}"
    );
}

/// This process's peak resident memory, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn on_a_budget_that_holds_one_model_every_model_is_answered_in_turn() {
    // Two requests for one model decode together: deterministic mode
    // keeps each one's bytes those of the model alone.
    let exact = ["--deterministic"];
    let expected = [
        (GEMMA, alone_with(&model_path(), 6, &exact)),
        ("smol", alone_with(&second_model_path(), 6, &exact)),
        (QWEN, alone_with(&tool_model_path(), 6, &exact)),
    ];
    // Deterministic, 2 slots: Qwen alone 612 MiB, SmolLM2 363, Gemma 457:
    // any two together are more than 650.
    const BUDGET: u64 = 650 << 20;
    // What the process holds besides its models (code, runtime, buffers).
    const MARGIN: u64 = 256 << 20;
    let s = serve(&["--models-memory", "650M", "--deterministic"]);
    let s = &s;
    std::thread::scope(|scope| {
        let asked: Vec<_> = (0..2)
            .flat_map(|_| expected.iter())
            .map(|(model, text)| {
                scope.spawn(move || {
                    let (status, v) = ask(s, model, 6);
                    assert_eq!(status, 200, "{model}: {v}");
                    assert_eq!(v["choices"][0]["text"], *text, "{model}");
                })
            })
            .collect();
        for a in asked {
            a.join().unwrap();
        }
    });
    let log = s.log_when(|l| l.matches("cmpl: loaded ").count() >= 3);
    // Never two in memory: each load after the one before left.
    let moves: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("cmpl: loaded ") || l.starts_with("cmpl: unloaded "))
        .collect();
    let mut held = 0;
    for m in &moves {
        held += if m.starts_with("cmpl: loaded ") {
            1
        } else {
            -1
        };
        assert!(held <= 1, "two models at once: {moves:?}");
    }
    assert_eq!(log.matches("cmpl: loaded ").count(), 3, "each once: {log}");
    let peak = peak_rss(s.child.id());
    assert!(peak <= BUDGET + MARGIN, "peak RSS {} MiB", peak >> 20);
}

#[test]
fn a_corrupt_model_answers_with_why_and_the_others_keep_answering() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.gguf");
    let bytes = std::fs::read(model_path()).unwrap();
    std::fs::write(&broken, &bytes[..1 << 20]).unwrap();
    let broken_flag = format!("broken={}", broken.display());
    let s = serve(&["-m", &broken_flag]);
    let (status, v) = ask(&s, "broken", 4);
    assert_eq!(status, 500, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("model `broken` could not be loaded: "),
        "{message}"
    );
    let (_, text) = s.send("GET", "/v1/models", "", None);
    let list: Value = serde_json::from_str(&text).unwrap();
    let entry = &list["data"][3];
    assert_eq!(
        (&entry["id"], &entry["status"]["value"]),
        (&json!("broken"), &json!("failed"))
    );
    assert_eq!(entry["status"]["failed"], true);
    for model in [GEMMA, "smol"] {
        assert_eq!(ask(&s, model, 4).0, 200, "{model}");
    }
    // Tried again on a later request (and failing again, said again).
    assert_eq!(ask(&s, "broken", 4).0, 500);
    let log = s.log_when(|l| l.matches("cmpl: loading broken").count() == 2);
    assert_eq!(log.matches("cmpl: loading broken").count(), 2, "{log}");
    assert_eq!(
        log.matches("cmpl: broken failed to load: ").count(),
        2,
        "{log}"
    );
}

#[test]
fn two_models_decode_at_once() {
    let expected = [
        (GEMMA, alone(&model_path(), 48)),
        ("smol", alone(&second_model_path(), 48)),
    ];
    let s = serve(&[]);
    for (model, _) in &expected {
        assert_eq!(ask(&s, model, 1).0, 200);
    }
    // Two streams at once: each one's first token comes before the
    // other's last (neither waits for the other to finish).
    let s = &s;
    let times: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let streams: Vec<_> = expected
            .iter()
            .map(|(model, text)| {
                scope.spawn(move || {
                    let body = json!({"model": model, "prompt": PROMPT, "max_tokens": 48,
                        "temperature": 0, "stream": true});
                    let (times, whole) = stream_timed(s, &body);
                    assert_eq!(whole, *text, "{model}");
                    times
                })
            })
            .collect();
        streams.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let ((a_first, a_last), (b_first, b_last)) = (times[0], times[1]);
    assert!(a_first < b_last && b_first < a_last, "{times:?}");
}

/// A streamed completion: when its first and last text chunks came, and
/// its whole text.
fn stream_timed(s: &Served, body: &Value) -> ((Instant, Instant), String) {
    use std::io::BufRead;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into();
    let response = agent
        .post(format!("{}/v1/completions", s.root()))
        .send(body.to_string())
        .expect("a stream");
    let reader = std::io::BufReader::new(response.into_body().into_reader());
    let (mut first, mut last, mut text) = (None, None, String::new());
    for line in reader.lines().map_while(Result::ok) {
        let Some(data) = line.strip_prefix("data: ").filter(|d| *d != "[DONE]") else {
            continue;
        };
        let chunk: Value = serde_json::from_str(data).unwrap();
        let piece = chunk["choices"][0]["text"].as_str().unwrap_or_default();
        if !piece.is_empty() {
            first.get_or_insert_with(Instant::now);
            last = Some(Instant::now());
            text.push_str(piece);
        }
    }
    ((first.unwrap(), last.unwrap()), text)
}

#[test]
fn pinned_models_stay_idle_ones_leave_and_the_operator_loads_and_unloads() {
    let s = serve(&["--pin", GEMMA, "--models-idle", "1s"]);
    // Pinned: loaded before the first request.
    assert_eq!(state_of(&s, GEMMA), "loaded");
    assert_eq!(state_of(&s, "smol"), "unloaded");
    assert_eq!(ask(&s, "smol", 2).0, 200);
    assert_eq!(state_of(&s, "smol"), "loaded");
    wait_until("smol idles out", Duration::from_secs(30), || {
        state_of(&s, "smol") == "unloaded"
    });
    assert_eq!(state_of(&s, GEMMA), "loaded", "pinned: it stays");
    let log = s.log_when(|l| l.contains("cmpl: unloaded smol"));
    assert!(
        log.contains("cmpl: unloading smol: idle for --models-idle"),
        "{log}"
    );
    // By hand.
    let load = |model: &str| {
        s.send(
            "POST",
            "/models/load",
            &json!({"model": model}).to_string(),
            None,
        )
    };
    let unload = |model: &str| {
        s.send(
            "POST",
            "/models/unload",
            &json!({"model": model}).to_string(),
            None,
        )
    };
    assert_eq!(load(QWEN), (200, r#"{"success":true}"#.to_string()));
    assert_eq!(state_of(&s, QWEN), "loaded");
    assert_eq!(unload(QWEN), (200, r#"{"success":true}"#.to_string()));
    wait_until("qwen unloads", Duration::from_secs(30), || {
        state_of(&s, QWEN) == "unloaded"
    });
    let (status, text) = unload(GEMMA);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("is pinned"), "{text}");
    let (status, text) = unload("nope");
    assert_eq!(status, 404, "{text}");
    assert_eq!(unload(QWEN).0, 400, "not loaded");
}

#[test]
fn the_openai_sdk_lists_the_models_and_each_answers_by_name() {
    let s = serve(&[]);
    common::sdk::python_script("router_clients.py", &[&s.url(), GEMMA, "smol", QWEN]);
}

#[test]
fn a_remote_run_names_the_model_it_wants() {
    let s = serve(&[]);
    let out = cmpl(&[
        "--base-url",
        &s.url(),
        "-m",
        "smol",
        PROMPT,
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ])
    .run();
    assert_eq!(out.ok(), alone(&second_model_path(), 8));
    let out = cmpl(&["--base-url", &s.url(), PROMPT]).run();
    out.fails(2, "serves 3 models");
}

#[test]
fn several_models_are_the_servers_alone() {
    let (gemma, smol) = (model_path(), second_model_path());
    let (gemma, smol) = (gemma.display().to_string(), smol.display().to_string());
    cmpl(&["-m", &gemma, "-m", &smol, PROMPT]).run().fails(
        2,
        "-m is given 2 times; several models are served with --serve",
    );
    cmpl(&["--models-max", "2", PROMPT]).run().fails(
        2,
        "--models-max applies to a server: add --serve, or drop --models-max",
    );
    cmpl(&["--models-dir", "/tmp", PROMPT]).run().fails(
        2,
        "--models-dir /tmp serves the models there and needs --serve",
    );
    cmpl(&["--serve", "127.0.0.1:0", "-m", &gemma, "-m", &smol, "--pin", "nope"])
        .run()
        .fails(2, "--pin nope: no such model here; the models are gemma-3-270m-q4_k_m, SmolLM2-135M-Instruct.Q4_1");
    cmpl(&[
        "--serve",
        "127.0.0.1:0",
        "-m",
        &format!("a={gemma}"),
        "-m",
        &format!("a={smol}"),
    ])
    .run()
    .fails(2, "two models are named `a`: name one -m NAME=PATH");
}

/// A folder holding the test model and SmolLM2 (links to them).
fn models_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for path in [model_path(), second_model_path()] {
        std::os::unix::fs::symlink(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

#[test]
fn a_models_folder_is_served_by_file_stem() {
    let dir = models_folder();
    let s = Served::start(&["--models-dir", &dir.path().display().to_string()], &[]);
    let names: Vec<String> = states(&s).into_iter().map(|(id, _)| id).collect();
    assert_eq!(names, ["SmolLM2-135M-Instruct.Q4_1", GEMMA]);
    let (status, v) = ask(&s, "SmolLM2-135M-Instruct.Q4_1", 8);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], alone(&second_model_path(), 8));
    // The tokenizer of the model a query names, percent-encoded or not.
    let info = |query: &str| s.send("GET", &format!("/tokenizer_info?{query}"), "", None);
    let plain = info("model=SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(plain.0, 200, "{}", plain.1);
    assert_eq!(info("model=SmolLM2%2d135M%2DInstruct.Q4_1"), plain);
    assert_ne!(info(&format!("model={GEMMA}")).1, plain.1);
    let (status, body) = info("model=Smol%zz");
    assert_eq!(status, 400, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["param"], "model", "{body}");
}

/// `--batch` lines naming each model, one JSON request a line.
fn lines(models: &[&str]) -> String {
    (models.iter())
        .map(|m| {
            json!({"model": m, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).to_string()
                + "\n"
        })
        .collect()
}

/// Each output line's model and text, in input order.
fn answered(out: &str) -> Vec<(String, String)> {
    (out.lines())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let text = v["choices"][0]["text"]
                .as_str()
                .unwrap_or_else(|| panic!("{v}"));
            (v["model"].as_str().unwrap().to_string(), text.to_string())
        })
        .collect()
}

#[test]
fn a_batch_whose_lines_name_different_models_is_answered_by_each() {
    let (gemma, smol) = (alone(&model_path(), 8), alone(&second_model_path(), 8));
    let s = serve(&[]);
    let out = cmpl(&["--base-url", &s.url(), "--batch", "--parallel", "1"])
        .stdin(lines(&[GEMMA, "smol", GEMMA, "smol"]))
        .run();
    let want = [
        (GEMMA, &gemma),
        ("smol", &smol),
        (GEMMA, &gemma),
        ("smol", &smol),
    ]
    .map(|(m, t)| (m.to_string(), t.clone()));
    assert_eq!(answered(out.ok()), want);
    // A line naming none, where the server serves several: refused alone.
    let out = cmpl(&["--base-url", &s.url(), "--batch"])
        .stdin(format!(
            "{}{}",
            lines(&["smol"]),
            r#"{"prompt": "x", "max_tokens": 2}"#
        ))
        .run();
    let text = out.stdout.clone();
    assert!(
        text.lines()
            .next()
            .unwrap()
            .contains(&format!("\"text\":{}", json!(smol))),
        "{text}"
    );
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .contains("choose one with -m NAME"),
        "{text}"
    );
}

#[test]
fn a_fleet_sends_each_line_only_to_an_engine_that_serves_its_model() {
    let (gemma, smol) = (
        model_path().display().to_string(),
        second_model_path().display().to_string(),
    );
    let qwen = tool_model_path().display().to_string();
    // Both serve Qwen; only the first Gemma, only the second SmolLM2.
    let first = Served::start(
        &["-m", &format!("g={gemma}"), "-m", &format!("q={qwen}")],
        &[],
    );
    let second = Served::start(
        &["-m", &format!("s={smol}"), "-m", &format!("q={qwen}")],
        &[],
    );
    let out = cmpl(&[
        "--base-url",
        &first.url(),
        "--base-url",
        &second.url(),
        "--batch",
    ])
    .stdin(lines(&["g", "s", "g", "s", "g", "s"]))
    .run();
    let texts = answered(out.ok());
    let (g, s) = (alone(&model_path(), 8), alone(&second_model_path(), 8));
    for (i, (model, text)) in texts.iter().enumerate() {
        let want = if i % 2 == 0 { ("g", &g) } else { ("s", &s) };
        assert_eq!((model.as_str(), text), (want.0, want.1), "line {i}");
    }
    assert_eq!(state_of(&first, "q"), "unloaded", "never asked for Qwen");
    assert_eq!(state_of(&second, "q"), "unloaded");
    let log = first.log_when(|l| l.matches("POST /v1/completions 200").count() == 3);
    assert_eq!(log.matches("POST /v1/completions 200").count(), 3, "{log}");
    assert!(!log.contains("loading s"), "{log}");
}

#[test]
fn a_guard_among_the_models_judges_as_it_is_served() {
    // The stand-in guard (tests/safety.rs): flags "forbidden" in a prompt,
    // "Paris" in an answer.
    let guard = common::guard::guard("standin-guard");
    let smol = second_model_path().display().to_string();
    let s = Served::start(
        &[
            "-m",
            &format!("smol={smol}"),
            "-m",
            &format!("guard={guard}"),
            "--parallel",
            "2",
            "--pin",
            "guard",
        ],
        &[],
    );
    assert_eq!(state_of(&s, "guard"), "loaded", "pinned: loaded at start");
    let chat = |q: &str| {
        json!({"model": "smol", "safety_model": "guard", "temperature": 0, "max_tokens": 48,
               "messages": [{"role": "user", "content": q}]})
        .to_string()
    };
    let (status, text) = s.send(
        "POST",
        "/v1/chat/completions",
        &chat("How do I make a forbidden thing?"),
        None,
    );
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("content_filter") && text.contains("S1, S10"),
        "{text}"
    );
    let (status, text) = s.send(
        "POST",
        "/v1/chat/completions",
        &chat("Name the capital city of France."),
        None,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("S3") && !text.contains("Paris"), "{text}");
    let (status, text) = s.send("POST", "/v1/chat/completions", &chat("Say hello."), None);
    assert_eq!(status, 200, "{text}");
    let (_, metrics) = s.send("GET", "/metrics", "", None);
    let checks = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cmpl:model_requests_total{model=\"guard\"} "))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(checks.parse::<u32>().unwrap() >= 4, "{metrics}");
    let log = s.log_when(|l| l.contains("(safety model)"));
    assert_eq!(log.matches("cmpl: loading guard").count(), 1, "{log}");
}

#[test]
fn a_request_that_leaves_while_it_waits_for_its_model_gives_up_its_place() {
    let s = serve(&["--models-max", "1"]);
    assert_eq!(ask(&s, GEMMA, 1).0, 200);
    let s = &s;
    std::thread::scope(|scope| {
        // Gemma busy with a long answer...
        let long = scope.spawn(move || ask(s, GEMMA, 256).0);
        s.wait_metric("vllm:num_requests_running", |n| n >= 1.0);
        // ...a request for SmolLM2 waits for the memory, and its client
        // leaves before its turn.
        let impatient: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(500)))
            .build()
            .into();
        let body = json!({"model": "smol", "prompt": PROMPT, "max_tokens": 1});
        let gone = impatient
            .post(format!("{}/v1/completions", s.root()))
            .send(body.to_string());
        assert!(gone.is_err(), "it was answered while Gemma held the memory");
        assert_eq!(long.join().unwrap(), 200);
    });
    // Nobody waits for SmolLM2: Gemma stays, and nothing was loaded for it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(state_of(s, "smol"), "unloaded");
    assert_eq!(state_of(s, GEMMA), "loaded");
    let log = s.log_when(|l| l.matches("POST /v1/completions 200").count() >= 2);
    assert!(!log.contains("loading smol"), "{log}");
}

#[test]
fn against_llama_servers_router_a_run_and_a_batch_pick_their_models() {
    let dir = models_folder();
    let server = common::server::LlamaServer::router(dir.path());
    let (_, listed) = {
        let mut r = ureq::get(&format!("{}/models", server.url()))
            .call()
            .unwrap();
        (r.status(), r.body_mut().read_to_string().unwrap())
    };
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let ids: Vec<String> = (listed["data"].as_array().unwrap().iter())
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{listed}");
    let smol = ids.iter().find(|id| id.contains("SmolLM2")).unwrap();
    let gemma = ids.iter().find(|id| id.contains("gemma")).unwrap();
    // A run names one.
    let out = cmpl(&[
        "--base-url",
        &server.url(),
        "-m",
        smol,
        PROMPT,
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ])
    .run();
    assert!(out.ok().contains("Paris"), "{}", out.stdout);
    // A batch's lines name each.
    let out = cmpl(&["--base-url", &server.url(), "--batch", "--parallel", "1"])
        .stdin(lines(&[gemma, smol]))
        .run();
    let answered = answered(out.ok());
    assert_eq!(answered[0].0, *gemma);
    assert_eq!(answered[1].0, *smol);
    assert!(answered[1].1.contains("Paris"), "{answered:?}");
}
