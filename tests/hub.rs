//! `-m hf.co/ORG/REPO[:QUANT]` against a stand-in hub on 127.0.0.1 that
//! speaks the hub's protocol and serves the real test model: the download
//! path, the cache layout huggingface_hub shares, offline use, resuming,
//! checking, quant choice, split models, and the errors a user meets.

use crate::common;

use common::hub::{sha256_of, Fault, HubFile, HubRepo, StandInHub};
use common::run::{cmpl, model_path, Cmpl};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tempfile::TempDir;

const REPO: &str = "cmpl-test/gemma-3-270m-GGUF";
const FILE: &str = "gemma-3-270m-Q4_K_M.gguf";
const PROMPT: &str = "The capital of France is";

fn one_model_repo() -> HubRepo {
    HubRepo::new(REPO, vec![HubFile::new(FILE, &model_path())])
}

/// cmpl against `hub`, with its own hub cache.
fn on(hub: &StandInHub, cache: &Path, args: &[&str]) -> Cmpl {
    cmpl(args)
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_CACHE", cache)
}

fn greedy(model: &str) -> Vec<String> {
    [
        model,
        PROMPT,
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    ]
    .map(str::to_string)
    .to_vec()
}

/// The local file's answer, for comparison.
fn local_text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let model = model_path();
        let out = cmpl(&["-m"]).args(greedy(model.to_str().unwrap())).run();
        out.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    })
}

fn blobs(cache: &Path, repo: &str) -> Vec<String> {
    let dir = cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("blobs");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn downloads_once_into_the_shared_layout_and_answers_as_the_local_file() {
    let cache = TempDir::new().unwrap();
    let hub = StandInHub::start(vec![one_model_repo()], Fault::None);
    let name = format!("hf.co/{REPO}:Q4_K_M");
    let run = |extra: &[(&str, &str)]| {
        let mut c = on(&hub, cache.path(), &["-m"]).args(greedy(&name));
        for (k, v) in extra {
            c = c.env(k, v);
        }
        c.run()
    };

    let first = run(&[("HF_TOKEN", "hf_cmpl_test_secret")]);
    let response = first.json();
    assert_eq!(response["model"], name.as_str());
    assert_eq!(response["choices"][0]["text"], local_text());
    assert_eq!(
        first.stderr, "",
        "nothing on stderr when it is not a terminal"
    );
    assert!(!first.stdout.contains("hf_cmpl_test_secret"));

    // The requests: the listing and the resolve carry the token; the bytes,
    // on another host, do not.
    let seen = hub.seen();
    let paths: Vec<(&str, &str)> = seen
        .iter()
        .map(|s| (s.method.as_str(), s.path.as_str()))
        .collect();
    let sha = sha256_of(&model_path());
    let commit = one_model_repo().commit;
    assert_eq!(
        paths,
        [
            ("GET", format!("/api/models/{REPO}/revision/main").as_str()),
            ("HEAD", format!("/{REPO}/resolve/{commit}/{FILE}").as_str()),
            ("GET", format!("/repos/{sha}?file={FILE}").as_str()),
        ]
    );
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some("Bearer hf_cmpl_test_secret")
    );
    assert_eq!(
        seen[1].authorization.as_deref(),
        Some("Bearer hf_cmpl_test_secret")
    );
    assert_eq!(
        seen[2].authorization, None,
        "the token never leaves the hub's host"
    );

    // huggingface_hub's layout: the blob by its sha256, a relative link in
    // the snapshot, refs/main.
    let repo_dir = cache.path().join("models--cmpl-test--gemma-3-270m-GGUF");
    assert_eq!(blobs(cache.path(), REPO), std::slice::from_ref(&sha));
    let link = repo_dir.join("snapshots").join(&commit).join(FILE);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        PathBuf::from(format!("../../blobs/{sha}"))
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        commit
    );

    // Again: one listing request, no download.
    let second = run(&[]);
    assert_eq!(second.json()["choices"][0]["text"], local_text());
    assert_eq!(hub.seen().len(), 4);
    assert!(!hub.seen()[3].cdn);

    // Offline: no request at all.
    let offline = run(&[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(offline.json()["choices"][0]["text"], local_text());
    assert_eq!(hub.seen().len(), 4);

    // Named by a request's `model`, or by CMPL_MODEL, the same.
    let request =
        serde_json::json!({"model": name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0});
    let by_request = cmpl(&["--json"])
        .stdin(request.to_string())
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .run();
    assert_eq!(by_request.json()["model"], name.as_str());
    assert_eq!(by_request.json()["choices"][0]["text"], local_text());
    let by_env = cmpl(&[PROMPT, "--max-tokens", "8", "--temperature", "0", "--json"])
        .env("CMPL_MODEL", &name)
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .run();
    assert_eq!(by_env.json()["model"], name.as_str());

    // The hub unreachable: the cached file, with a note.
    let unreachable = cmpl(&["-m"])
        .args(greedy(&name))
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HUB_CACHE", cache.path())
        .run();
    assert_eq!(unreachable.json()["choices"][0]["text"], local_text());
    assert!(
        unreachable.stderr.contains("using the cached"),
        "{}",
        unreachable.stderr
    );

    // Listed by the name that loads it.
    let listed = on(&hub, cache.path(), &["--list-models"]).run();
    assert!(listed.ok().contains(&name), "{}", listed.stdout);
}

#[test]
fn a_terminal_shows_the_download_and_a_pipe_does_not() {
    let cache = TempDir::new().unwrap();
    let hub = StandInHub::start(vec![one_model_repo()], Fault::Slow);
    let out = common::run::cmpl_on_a_terminal(&format!("-m hf.co/{REPO} 'Hi' --max-tokens 1"))
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_CACHE", cache.path())
        .run();
    let shown = out.ok();
    assert!(shown.contains(&format!("downloading {FILE}")), "{shown}");
    assert!(shown.contains("MiB/s"), "{shown}");
}

#[test]
fn offline_without_the_file_fails_and_says_why() {
    let cache = TempDir::new().unwrap();
    let hub = StandInHub::start(vec![one_model_repo()], Fault::None);
    let name = format!("hf.co/{REPO}");
    let out = on(&hub, cache.path(), &["-m", &name, PROMPT])
        .env("HF_HUB_OFFLINE", "1")
        .run();
    out.fails(1, "is not in the hub cache");
    out.fails(1, "HF_HUB_OFFLINE");
    assert!(hub.seen().is_empty());

    let out = cmpl(&["-m", &name, PROMPT])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HUB_CACHE", cache.path())
        .run();
    out.fails(1, "cannot reach the hub at http://127.0.0.1:9");
    out.fails(1, "HF_HUB_OFFLINE=1");
}

#[test]
fn a_connection_cut_mid_file_resumes_where_it_stopped() {
    let cache = TempDir::new().unwrap();
    let cut = 100_000_000;
    let hub = StandInHub::start(vec![one_model_repo()], Fault::CutAt(cut));
    let out = on(&hub, cache.path(), &["-m"])
        .args(greedy(&format!("hf.co/{REPO}")))
        .run();
    assert_eq!(out.json()["choices"][0]["text"], local_text());
    let ranges: Vec<Option<String>> = hub.downloads().into_iter().map(|s| s.range).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={cut}-"))]);
    assert_eq!(blobs(cache.path(), REPO), [sha256_of(&model_path())]);
}

#[test]
fn ctrl_c_keeps_a_partial_file_that_the_next_run_resumes() {
    let cache = TempDir::new().unwrap();
    let name = format!("hf.co/{REPO}");
    let partial = {
        let hub = StandInHub::start(vec![one_model_repo()], Fault::Slow);
        let child = on(&hub, cache.path(), &["-m", &name, PROMPT]).spawn();
        let incomplete = cache
            .path()
            .join("models--cmpl-test--gemma-3-270m-GGUF/blobs")
            .join(format!("{}.incomplete", sha256_of(&model_path())));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::fs::metadata(&incomplete).map_or(0, |m| m.len()) < 3 << 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "the download did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(130),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let size = std::fs::metadata(&incomplete).unwrap().len();
        assert!(
            (3 << 20..200 << 20).contains(&size),
            "partial file of {size} bytes"
        );
        size
    };
    let hub = StandInHub::start(vec![one_model_repo()], Fault::None);
    let out = on(&hub, cache.path(), &["-m"]).args(greedy(&name)).run();
    assert_eq!(out.json()["choices"][0]["text"], local_text());
    let ranges: Vec<Option<String>> = hub.downloads().into_iter().map(|s| s.range).collect();
    assert_eq!(ranges, [Some(format!("bytes={partial}-"))]);
    assert_eq!(blobs(cache.path(), REPO), [sha256_of(&model_path())]);
}

#[test]
fn a_corrupted_download_is_refused_and_deleted() {
    let cache = TempDir::new().unwrap();
    let hub = StandInHub::start(vec![one_model_repo()], Fault::Corrupt);
    let out = on(
        &hub,
        cache.path(),
        &["-m", &format!("hf.co/{REPO}"), PROMPT],
    )
    .run();
    let sha = sha256_of(&model_path());
    out.fails(1, &format!("{REPO}/{FILE}: its sha256 is "));
    out.fails(1, &format!("the hub's is {sha}; the download was deleted"));
    assert_eq!(blobs(cache.path(), REPO), Vec::<String>::new());
    let snapshots = cache
        .path()
        .join("models--cmpl-test--gemma-3-270m-GGUF/snapshots");
    assert!(
        !snapshots.exists()
            || std::fs::read_dir(&snapshots).unwrap().all(|d| {
                std::fs::read_dir(d.unwrap().path())
                    .unwrap()
                    .next()
                    .is_none()
            })
    );
}

#[test]
fn two_processes_fetching_the_same_file_download_it_once() {
    let cache = TempDir::new().unwrap();
    let hub = StandInHub::start(vec![one_model_repo()], Fault::None);
    let name = format!("hf.co/{REPO}");
    let runs: Vec<_> = (0..2)
        .map(|_| on(&hub, cache.path(), &["-m"]).args(greedy(&name)).spawn())
        .collect();
    for child in runs {
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let response: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(response["choices"][0]["text"], local_text());
    }
    assert_eq!(hub.downloads().len(), 1);
    assert_eq!(blobs(cache.path(), REPO), [sha256_of(&model_path())]);
}

#[test]
fn quants_are_chosen_as_llama_cpp_chooses_them() {
    let cache = TempDir::new().unwrap();
    let scratch = TempDir::new().unwrap();
    let model = model_path();
    let repo = HubRepo::new(
        "cmpl-test/quants",
        vec![
            HubFile::text("README.md", scratch.path()),
            HubFile::new("mmproj-m-F16.gguf", &model),
            HubFile::new("m-F16.gguf", &model),
            HubFile::new("m-Q8_0.gguf", &model),
            HubFile::new("m-Q4_K_M.gguf", &model),
        ],
    );
    let empty = HubRepo::new(
        "cmpl-test/no-gguf",
        vec![HubFile::text("README.md", scratch.path())],
    );
    // A hostile hub's names that would leave the cache folder are not files.
    let evil = HubRepo::new(
        "cmpl-test/evil",
        vec![
            HubFile::new("../../../../escaped-Q4_K_M.gguf", &model),
            HubFile::new("/tmp/absolute-Q4_K_M.gguf", &model),
        ],
    );
    let hub = StandInHub::start(vec![repo, empty, evil], Fault::None);
    let resolved = |name: &str| {
        let before = hub.seen().len();
        let out = on(
            &hub,
            cache.path(),
            &["-m", name, PROMPT, "--max-tokens", "1"],
        )
        .run();
        out.ok();
        hub.seen()[before..]
            .iter()
            .filter(|s| s.method == "HEAD")
            .map(|s| s.path.rsplit('/').next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(resolved("hf.co/cmpl-test/quants"), ["m-Q4_K_M.gguf"]);
    assert_eq!(resolved("hf.co/cmpl-test/quants:q8_0"), ["m-Q8_0.gguf"]);
    // The same bytes under another name: linked, not fetched again.
    assert_eq!(hub.downloads().len(), 1);

    let out = on(
        &hub,
        cache.path(),
        &["-m", "hf.co/cmpl-test/quants:Q5_K_M", PROMPT],
    )
    .run();
    out.fails(
        1,
        "cmpl-test/quants has no GGUF for quant `Q5_K_M`; it has: F16, Q4_K_M, Q8_0 (write hf.co/cmpl-test/quants:F16)",
    );
    on(
        &hub,
        cache.path(),
        &["-m", "hf.co/cmpl-test/no-gguf", PROMPT],
    )
    .run()
    .fails(1, "cmpl-test/no-gguf at http://127.0.0.1:");
    on(&hub, cache.path(), &["-m", "hf.co/cmpl-test/evil", PROMPT])
        .run()
        .fails(1, "cmpl-test/evil at http://127.0.0.1:");
    assert!(!cache
        .path()
        .parent()
        .unwrap()
        .join("escaped-Q4_K_M.gguf")
        .exists());
    assert_eq!(blobs(cache.path(), "cmpl-test/evil"), Vec::<String>::new());
}

/// The test model split in two by llama.cpp's own llama-gguf-split.
fn split_model() -> &'static (TempDir, PathBuf, PathBuf) {
    static SPLIT: OnceLock<(TempDir, PathBuf, PathBuf)> = OnceLock::new();
    SPLIT.get_or_init(|| {
        let tool = std::env::var_os("CMPL_GGUF_SPLIT").expect(
            "CMPL_GGUF_SPLIT is not set: run scripts/test, which builds llama-gguf-split (bench/compare --server)",
        );
        let dir = TempDir::new().unwrap();
        let out = std::process::Command::new(tool)
            .args(["--split", "--split-max-tensors", "120"])
            .arg(model_path())
            .arg(dir.path().join("m-Q4_K_M"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let first = dir.path().join("m-Q4_K_M-00001-of-00002.gguf");
        let second = dir.path().join("m-Q4_K_M-00002-of-00002.gguf");
        assert!(first.is_file() && second.is_file(), "llama-gguf-split made other files");
        (dir, first, second)
    })
}

#[test]
fn a_split_model_is_fetched_whole_and_loads() {
    let (_, first, second) = split_model();
    let cache = TempDir::new().unwrap();
    let repo = HubRepo::new(
        "cmpl-test/split",
        vec![
            HubFile::new("Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", second),
            HubFile::new("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", first),
        ],
    );
    let hub = StandInHub::start(vec![repo], Fault::None);
    let out = on(&hub, cache.path(), &["-m"])
        .args(greedy("hf.co/cmpl-test/split:Q4_K_M"))
        .run();
    assert_eq!(out.json()["choices"][0]["text"], local_text());
    assert_eq!(hub.downloads().len(), 2);
    let mut want = vec![sha256_of(first), sha256_of(second)];
    want.sort();
    assert_eq!(blobs(cache.path(), "cmpl-test/split"), want);
}

#[test]
fn gated_and_unknown_repositories_say_what_to_do() {
    let cache = TempDir::new().unwrap();
    let mut gated = one_model_repo();
    gated.id = "cmpl-test/gated".into();
    gated.gated_token = Some("hf_granted".into());
    let hub = StandInHub::start(vec![gated], Fault::None);
    let name = "hf.co/cmpl-test/gated";
    on(&hub, cache.path(), &["-m", name, PROMPT]).run().fails(
        1,
        "cmpl-test/gated is gated: accept its terms at http://127.0.0.1:",
    );
    on(&hub, cache.path(), &["-m", name, PROMPT]).run().fails(
        1,
        "then set HF_TOKEN to a token from https://huggingface.co/settings/tokens",
    );
    let wrong = on(&hub, cache.path(), &["-m", name, PROMPT])
        .env("HF_TOKEN", "hf_wrong_token")
        .run();
    wrong.fails(1, "is gated");
    assert!(
        !wrong.stderr.contains("hf_wrong_token"),
        "the token is never printed"
    );
    let granted = on(
        &hub,
        cache.path(),
        &["-m", name, PROMPT, "--max-tokens", "1"],
    )
    .env("HF_TOKEN", "hf_granted")
    .run();
    granted.ok();
    assert!(hub.downloads().iter().all(|s| s.authorization.is_none()));

    on(
        &hub,
        cache.path(),
        &["-m", "hf.co/cmpl-test/nothing-here", PROMPT],
    )
    .run()
    .fails(
        1,
        "repository cmpl-test/nothing-here not found at http://127.0.0.1:",
    );
    on(&hub, cache.path(), &["-m", "hf.co/just-one-part", PROMPT])
        .run()
        .fails(
            1,
            "`hf.co/just-one-part` is not a hub model name: write hf.co/ORG/REPO",
        );
}
