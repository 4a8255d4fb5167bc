//! The house's shape, kept: the compiler keeps the crates apart (the core
//! cannot name the engine, the engine cannot name a face); this keeps what
//! the compiler cannot: no circle among the modules of any crate, and no
//! llama.cpp in the core's manifest (docs/architecture.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the crate at `src` (a file or a folder) and the
/// top-level modules its code names as `crate::module`.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if matches!(name.as_str(), "lib" | "main") {
            continue;
        }
        let mut files = Vec::new();
        collect(&path, &mut files);
        let names = graph.entry(name.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (at, _) in text.match_indices("crate::") {
                let rest = &text[at + "crate::".len()..];
                // `crate::a::b`, or a group: `crate::{a, b::c, D}`.
                let named: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap_or(0)]
                        .split(',')
                        .map(str::trim)
                        .collect(),
                    None => vec![rest],
                };
                for item in named {
                    let module: String = item
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    // A name at the crate's root (a type in lib.rs) is no module.
                    let is_module =
                        src.join(format!("{module}.rs")).exists() || src.join(&module).is_dir();
                    if is_module && module != name {
                        names.insert(module);
                    }
                }
            }
        }
    }
    graph
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            collect(&entry.unwrap().path(), files);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        files.push(path.to_path_buf());
    }
}

/// A circle in `graph`, if there is one, as the modules along it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in ["src", "crates/core/src", "crates/engine/src"] {
        let graph = imports(&root.join(src));
        assert!(graph.len() > 5, "{src}: only {} modules found", graph.len());
        if let Some(found) = circle(&graph) {
            panic!("{src}: an import circle: {}", found.join(" -> "));
        }
    }
}

#[test]
fn the_circle_check_finds_circles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(circle(&graph).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn the_core_has_no_llama_cpp_and_the_engine_no_face() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let core = std::fs::read_to_string(root.join("crates/core/Cargo.toml")).unwrap();
    let deps: String = core
        .split("[dependencies]")
        .nth(1)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !deps.contains("llama"),
        "the core depends on llama.cpp:\n{deps}"
    );
    assert!(
        !deps.contains("cmpl"),
        "the core depends on another cmpl crate:\n{deps}"
    );
    let engine = std::fs::read_to_string(root.join("crates/engine/Cargo.toml")).unwrap();
    let cmpl_deps: Vec<&str> = engine.lines().filter(|l| l.starts_with("cmpl")).collect();
    assert_eq!(cmpl_deps, ["cmpl-core = { path = \"../core\" }"]);
    // The GPU features reach llama.cpp through the engine.
    let top = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for gpu in ["cuda", "metal", "vulkan"] {
        assert!(
            top.contains(&format!("{gpu} = [\"cmpl-engine/{gpu}\"]")),
            "{gpu}"
        );
        assert!(
            engine.contains(&format!("{gpu} = [\"llama-cpp-2/{gpu}\"")),
            "{gpu}"
        );
    }
}

/// The code's files outside tests: `src/` and the crates', each with its
/// text before its unit-test module (a test-only helper above it counts:
/// it is read with the rest).
fn code() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for src in ["src", "crates/core/src", "crates/engine/src"] {
        collect(&root.join(src), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let code = before_tests(&text).to_string();
            (f.strip_prefix(root).unwrap().display().to_string(), code)
        })
        .collect()
}

/// A file's text up to its unit-test module (`#[cfg(test)]` over a
/// `mod tests`, private or not).
fn before_tests(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]\n") {
        let start = at + i;
        let next = &text[start + "#[cfg(test)]\n".len()..];
        if next
            .lines()
            .next()
            .is_some_and(|l| l.trim_end().ends_with("mod tests {"))
        {
            return &text[..start];
        }
        at = start + 1;
    }
    text
}

/// Where the same word means something else than a request field: a chat
/// role (`"user"`, `"system"`), a finish reason (`"stop"`), the template's
/// name in its renderer, clap's argument ids, a key of a response or of
/// `--ps`'s status.
const OTHER_MEANINGS: &[&str] = &[
    "Message::new(",
    "\"assistant\"",
    "Finish::",
    "_template(\"",
    "conflicts_with",
    "long = \"n\"",
    "[\"model\"]",
    "[\"prompt\"]",
    "\"object\": \"model\"",
    "\"model\": shared",
];

#[test]
fn each_request_field_is_named_once() {
    // The cut is at the test module: what is above it is read.
    let read: Vec<_> = code().into_iter().map(|(_, c)| c).collect();
    assert!(read
        .iter()
        .any(|c| c.contains("pub fn unconnected(base: &str)")));
    let mut found = Vec::new();
    for (file, code) in code() {
        if file == "crates/core/src/fields.rs" {
            continue;
        }
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//")
                || OTHER_MEANINGS.iter().any(|m| line.contains(m))
            {
                continue;
            }
            for field in cmpl::fields::TABLE {
                let quoted = format!("\"{}\"", field.name);
                let at = line.match_indices(&quoted).any(|(i, _)| {
                    // The whole literal: not the end of a longer one.
                    let before = line[..i].chars().next_back();
                    !matches!(before, Some(c) if c.is_alphanumeric() || c == '_' || c == '\\' || c == '`')
                });
                if at {
                    found.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "request fields named outside crates/core/src/fields.rs (use fields::NAME.name):\n{}",
        found.join("\n")
    );
}

#[test]
fn each_file_in_src_does_one_job_in_at_most_about_500_lines() {
    let long: Vec<String> = code()
        .into_iter()
        .filter(|(file, _)| file.starts_with("src/"))
        .filter(|(_, code)| code.lines().count() > 560)
        .map(|(file, code)| format!("{file}: {} lines", code.lines().count()))
        .collect();
    assert!(long.is_empty(), "split these by job:\n{}", long.join("\n"));
}
