//! `--batch` as a CI job runs it: `--output FILE` resumed after a SIGKILL
//! at any point, byte for byte, and OpenAI batch files (the format of the
//! OpenAI Batch API and `vllm run-batch`) in and out.

use crate::common;
use common::run::{cmpl, second_model_path, wait_until};
use common::schema::assert_valid;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// 40 greedy requests, different enough to finish at different times.
fn input(dir: &Path) -> std::path::PathBuf {
    let prompts = [
        "The capital of France is",
        "1, 2, 3, 4,",
        "Once upon a time",
        "def fibonacci(n):",
        "The best thing about rain is",
    ];
    let text: String = (0..40)
        .map(|i| {
            let prompt = format!("{} ({i})", prompts[i % prompts.len()]);
            format!(
                "{}\n",
                json!({"prompt": prompt, "max_tokens": 8 + (i % 4) * 4, "temperature": 0})
            )
        })
        .collect();
    let path = dir.join("in.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

/// The batch, writing to `out`: same bytes in any mix (`--deterministic`),
/// the same ids and `created` (SOURCE_DATE_EPOCH).
fn batch(input: &Path, out: &Path) -> common::run::Cmpl {
    cmpl(&[
        "--batch",
        &input.display().to_string(),
        "--output",
        &out.display().to_string(),
    ])
    .args(["--parallel", "4", "--deterministic"])
    .env("SOURCE_DATE_EPOCH", "1700000000")
}

/// Answers on disk: whole lines in FILE and entries in FILE.pending.
fn answered(out: &Path) -> usize {
    let count = |p: &Path| {
        std::fs::read_to_string(p)
            .map(|t| t.matches('\n').count())
            .unwrap_or(0)
    };
    count(out) + count(&out.with_extension("jsonl.pending"))
}

#[test]
fn a_killed_run_resumes_to_the_file_an_uninterrupted_run_writes() {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path());
    let whole_path = dir.path().join("whole.jsonl");
    let out = batch(&input, &whole_path).run();
    assert_eq!((out.code, out.stdout.as_str()), (0, ""), "{}", out.stderr);
    let whole = std::fs::read_to_string(&whole_path).unwrap();
    assert_eq!(whole.lines().count(), 40);
    assert!(!dir.path().join("whole.jsonl.pending").exists());
    for (at, percent) in [(12, 30), (24, 60), (36, 90)] {
        let path = dir.path().join(format!("killed-{percent}.jsonl"));
        let mut child = batch(&input, &path).spawn();
        wait_until("answers on disk", Duration::from_secs(300), || {
            answered(&path) >= at
        });
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before the kill at {percent}%"
        );
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let kept = std::fs::read_to_string(&path).unwrap();
        assert!(kept.lines().count() < 40, "{percent}%");
        let rerun = batch(&input, &path).run();
        assert_eq!(rerun.code, 0, "{}", rerun.stderr);
        let resumed = std::fs::read_to_string(&path).unwrap();
        assert!(
            resumed == whole,
            "resumed after a kill at {percent}%: not the uninterrupted file"
        );
        // Only what was missing was answered again.
        assert!(kept.lines().all(|l| whole.contains(l)));
        assert!(!Path::new(&format!("{}.pending", path.display())).exists());
    }
    // A finished file reruns to nothing; another input's file is refused.
    let again = batch(&input, &whole_path).run();
    assert_eq!(again.code, 0);
    assert_eq!(std::fs::read_to_string(&whole_path).unwrap(), whole);
    let short = dir.path().join("short.jsonl");
    std::fs::write(&short, "{\"prompt\": \"hi\", \"max_tokens\": 1}\n").unwrap();
    batch(&short, &whole_path)
        .run()
        .fails(2, "it holds another input's answers; give another --output");
}

#[test]
fn a_resumed_run_keeps_the_first_runs_time() {
    let dir = tempfile::tempdir().unwrap();
    let input = input(dir.path());
    let path = dir.path().join("out.jsonl");
    let run = || {
        cmpl(&[
            "--batch",
            &input.display().to_string(),
            "--output",
            &path.display().to_string(),
        ])
        .args(["--parallel", "4"])
        .env_remove("SOURCE_DATE_EPOCH")
    };
    let mut child = run().spawn();
    wait_until("answers on disk", Duration::from_secs(300), || {
        answered(&path) >= 8
    });
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(run().run().code, 0);
    let created: std::collections::BTreeSet<u64> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["created"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(created.len(), 1, "{created:?}");
}

#[test]
fn openai_batch_files_in_and_out() {
    let lines = [
        json!({"custom_id": "c-1", "method": "POST", "url": "/v1/completions",
               "body": {"model": "gpt-3.5-turbo-instruct", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}}),
        json!({"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Name the capital city of France."}],
                        "max_completion_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 2}}),
        json!({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}),
        json!({"custom_id": "bad-n", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "n": 0}}),
    ];
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let model = second_model_path().display().to_string();
    let out = cmpl(&["-m", &model, "--batch"]).stdin(input.clone()).run();
    assert_eq!(out.code, 1, "{}", out.stderr);
    let answers: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = answers
        .iter()
        .map(|a| a["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c-1", "chat-1", "bad-url", "bad-n"]);
    for a in &answers {
        assert!(a["id"].as_str().unwrap().starts_with("batch_req_"), "{a}");
        assert!(a["error"].is_null(), "{a}");
        let request_id = a["response"]["request_id"].as_str().unwrap();
        assert!(
            request_id.starts_with("cmpl-") || request_id.starts_with("chatcmpl-"),
            "{a}"
        );
        if a["response"]["status_code"] == 200 {
            assert_eq!(a["response"]["body"]["id"], request_id);
        }
    }
    let completion = &answers[0]["response"];
    assert_eq!(completion["status_code"], 200);
    assert_valid("CompletionResponse", &completion["body"]);
    assert_eq!(completion["body"]["model"], "gpt-3.5-turbo-instruct");
    // The same text as the line alone, as a plain request.
    let alone = cmpl(&[
        "-m",
        &model,
        "--json",
        "The capital of France is",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
    ])
    .run();
    assert_eq!(
        completion["body"]["choices"][0]["text"],
        alone.json()["choices"][0]["text"]
    );
    let chat = &answers[1]["response"];
    assert_eq!(chat["status_code"], 200);
    assert_eq!(chat["body"]["object"], "chat.completion");
    assert_eq!(chat["body"]["model"], "gpt-4o-mini");
    assert!(chat["body"]["id"]
        .as_str()
        .unwrap()
        .starts_with("chatcmpl-"));
    let message = &chat["body"]["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    assert!(
        message["content"].as_str().unwrap().contains("Paris"),
        "{chat}"
    );
    assert_eq!(
        chat["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    for (a, param) in [(&answers[2], "url"), (&answers[3], "n")] {
        assert_eq!(a["response"]["status_code"], 400);
        assert_valid("ErrorData", &a["response"]["body"]);
        assert_eq!(a["response"]["body"]["error"]["param"], param);
    }
    // Resumable too, and the same file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.jsonl");
    let run = || {
        cmpl(&[
            "-m",
            &model,
            "--batch",
            "--output",
            &path.display().to_string(),
        ])
        .stdin(input.clone())
        .env("SOURCE_DATE_EPOCH", "1")
    };
    assert_eq!(run().run().code, 1);
    let first = std::fs::read_to_string(&path).unwrap();
    assert_eq!(first.lines().count(), 4);
    assert_eq!(run().run().code, 1, "the file still holds a failed line");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
}
