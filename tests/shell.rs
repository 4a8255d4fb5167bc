//! Shell integration: generated files, the config file, models by name,
//! colour rules.

use crate::common;
use cmpl::generate::Kind;
use common::run::{cmpl, cmpl_on_a_terminal, model_path};
use std::path::{Path, PathBuf};

/// With CMPL_BLESS=1 (scripts/generate) the stale files are rewritten
/// instead: the list of generated files lives in one place, `Kind`.
#[test]
fn checked_in_files_are_what_the_code_generates() {
    let bless = std::env::var_os("CMPL_BLESS").is_some_and(|v| v == "1");
    for kind in Kind::ALL {
        let out = cmpl(&["--generate", kind.name()]).run();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind.path());
        if bless {
            std::fs::write(&path, out.ok()).unwrap();
            continue;
        }
        let file = std::fs::read_to_string(&path).unwrap();
        assert!(
            out.ok() == file,
            "{} is stale: regenerate with scripts/generate",
            kind.path()
        );
    }
}

#[test]
fn man_page_renders_without_warnings() {
    let page = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("man/cmpl.1");
    let out = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(&page)
        .output()
        .expect("groff is needed to check the man page (scripts/install-deps installs it)");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "groff warnings");
    let text = std::fs::read_to_string(&page).unwrap();
    for needle in [
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "EXAMPLES",
        "INPUT",
        "\\-\\-max\\-tokens",
        "0..20",
        "CMPL_CONFIG",
    ] {
        assert!(text.contains(needle), "man page lacks {needle}");
    }
}

/// A config file holding `body`, in a folder removed when it drops.
fn config(name: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, body).unwrap();
    (dir, file)
}

fn completion_tokens(args: &[&str], config_file: &PathBuf, stdin: Option<&str>) -> u64 {
    let mut c = cmpl(args).env("CMPL_CONFIG", config_file);
    if let Some(s) = stdin {
        c = c.stdin(s);
    }
    let out = c.run();
    out.ok();
    out.json()["usage"]["completion_tokens"].as_u64().unwrap()
}

#[test]
fn config_precedence_flags_then_request_then_config() {
    let (_dir, file) = config(
        "precedence.json",
        r#"{"max_tokens": 3, "temperature": 0, "threads": 1}"#,
    );
    assert_eq!(
        completion_tokens(&["Hi", "--json"], &file, None),
        3,
        "config over built-in"
    );
    let req = r#"{"prompt": "Hi", "max_tokens": 5}"#;
    assert_eq!(
        completion_tokens(&[], &file, Some(req)),
        5,
        "request over config"
    );
    assert_eq!(
        completion_tokens(&["--max-tokens", "2"], &file, Some(req)),
        2,
        "flag over request"
    );
    // The config's temperature 0 makes it greedy.
    let out = cmpl(&["The capital of France is", "--max-tokens", "8"])
        .env("CMPL_CONFIG", &file)
        .run();
    let greedy = cmpl(&[
        "The capital of France is",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ])
    .run();
    assert_eq!(out.ok(), greedy.ok());
    // The default config location is read too.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("cmpl")).unwrap();
    std::fs::write(home.path().join("cmpl/config.json"), r#"{"max_tokens": 4}"#).unwrap();
    let out = cmpl(&["Hi", "--json"])
        .env("XDG_CONFIG_HOME", home.path())
        .run();
    assert_eq!(out.json()["usage"]["completion_tokens"], 4);
}

#[test]
fn config_model_is_below_the_environment() {
    let (_dir, file) = config(
        "model.json",
        r#"{"model": "/nonexistent/from-config.gguf"}"#,
    );
    // CMPL_MODEL (set by the harness) wins over the config's model.
    cmpl(&["Hi", "--max-tokens", "1"])
        .env("CMPL_CONFIG", &file)
        .run()
        .ok();
    let out = cmpl(&["Hi"])
        .env("CMPL_CONFIG", &file)
        .env_remove("CMPL_MODEL")
        .run();
    out.fails(1, "from-config.gguf");
}

#[test]
fn a_broken_config_names_the_file_the_key_and_the_problem() {
    let cases = [
        ("bad-json.json", "{\"temperature\": 0,", "not valid JSON"),
        ("not-object.json", "[1]", "must be one JSON object"),
        (
            "unknown.json",
            "{\"temprature\": 0}",
            "key `temprature`: unknown key",
        ),
        (
            "range.json",
            "{\"temperature\": 9}",
            "key `temperature`: `temperature` must be a number from 0 to 2",
        ),
        ("type.json", "{\"stop\": 7}", "key `stop`"),
        (
            "threads.json",
            "{\"threads\": \"4\"}",
            "key `threads`: must be a whole number",
        ),
        // A runtime key takes what its flag takes (-t 0 is refused too).
        (
            "threads-zero.json",
            "{\"threads\": 0}",
            "key `threads`: invalid value '0' for '--threads <N>'",
        ),
        ("prompt.json", "{\"prompt\": \"x\"}", "key `prompt`"),
    ];
    for (name, body, says) in cases {
        let (_dir, file) = config(name, body);
        let out = cmpl(&["Hi", "--json"]).env("CMPL_CONFIG", &file).run();
        let stderr = out.fails(2, says);
        assert!(
            stderr.contains(file.to_str().unwrap()),
            "names the file: {stderr}"
        );
        common::schema::assert_valid("ErrorData", &out.json());
    }
    let out = cmpl(&["Hi"])
        .env("CMPL_CONFIG", "/nonexistent/cmpl.json")
        .run();
    out.fails(2, "/nonexistent/cmpl.json: cannot read it");
}

#[test]
fn models_are_found_by_name() {
    let name = model_path()
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    for given in [name.clone(), format!("{name}.gguf")] {
        let out = cmpl(&["-m", &given, "Hi", "--max-tokens", "1", "--json"])
            .env_remove("CMPL_MODEL")
            .run();
        out.ok();
        assert_eq!(
            out.json()["model"],
            given.as_str(),
            "the response names the model as given"
        );
    }
    let out = cmpl(&["-m", "no-such-model", "Hi"]).run();
    out.fails(1, "model `no-such-model` not found");
}

#[test]
fn list_models_reads_the_gguf_metadata() {
    let out = cmpl(&["--list-models"]).run();
    let line = out
        .ok()
        .lines()
        .find(|l| l.starts_with("gemma-3-270m-q4_k_m "))
        .unwrap_or_else(|| panic!("test model not listed: {}", out.stdout));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols, ["gemma-3-270m-q4_k_m", "253", "MB", "gemma3", "268M"]);
    assert!(out.stdout.starts_with("NAME"));
}

/// Runs cmpl under a pseudo-terminal (util-linux `script`), returning what it printed.
fn on_a_terminal(args: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = cmpl_on_a_terminal(args);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    cmd.run().ok().to_string()
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let args = "'The capital of France is' --max-tokens 6 --temperature 0 --echo --logprobs 1";
    // The SGR codes cmpl writes: dim, and 256-colour foregrounds.
    let coloured = |s: &str| s.contains("\u{1b}[2m") || s.contains("\u{1b}[38;5;");
    let tty = on_a_terminal(args, &[]);
    assert!(
        tty.contains("\u{1b}[2m"),
        "prompt dimmed on a terminal: {tty:?}"
    );
    assert!(
        tty.contains("\u{1b}[38;5;"),
        "tokens coloured by probability: {tty:?}"
    );
    assert!(tty.contains("token probability:"), "legend shown: {tty:?}");
    assert!(
        !coloured(&on_a_terminal(args, &[("NO_COLOR", "1")])),
        "NO_COLOR honoured"
    );
    assert!(!coloured(&on_a_terminal(
        &format!("{args} --color never"),
        &[]
    )));
    // Piped: plain text, unless forced.
    let argv = [
        "The capital of France is",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--echo",
        "--logprobs",
        "1",
    ];
    let piped = cmpl(&argv).run();
    let plain = cmpl(&argv[..5]).run();
    assert_eq!(
        piped.ok(),
        format!("The capital of France is{}", plain.ok())
    );
    let mut forced = argv.to_vec();
    forced.extend(["--color", "always"]);
    assert!(coloured(cmpl(&forced).run().ok()));
    // A terminal gets a final newline, a pipe the exact text.
    assert!(
        on_a_terminal("Hi --max-tokens 3 --temperature 0 --color never", &[]).ends_with("\r\n")
    );
}
