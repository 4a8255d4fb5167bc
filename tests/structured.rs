//! Structured output: JSON Schemas, JSON objects, regexes, choices and GBNF
//! grammars enforced while decoding, on the test model. Every answer that
//! ends with `stop` must parse and validate; most must end so; a choice
//! follows the model's own probabilities over its options.

use crate::common;
use common::run::cmpl;
use common::schema::{assert_valid, follows_single_run};
use common::served::Served;
use serde_json::{json, Value};

fn line(prompt: &str, extra: Value) -> Value {
    let mut r = json!({"prompt": prompt, "max_tokens": 96});
    r.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    r
}

fn schema_format(schema: &Value) -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}})
}

fn jsonl(lines: &[Value]) -> String {
    lines.iter().map(|l| l.to_string() + "\n").collect()
}

/// `cmpl --batch` over `lines`, successful: its answers, in order.
fn batch(lines: &[Value]) -> Vec<Value> {
    cmpl(&["--batch"])
        .stdin(jsonl(lines))
        .run()
        .ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `text` parses as JSON and validates against the validator's schema.
fn assert_validates(validator: &jsonschema::Validator, text: &str, what: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {text:?} is not JSON: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: {text} fails its schema: {errors:?}"
    );
}

/// Realistic schemas, each with a prompt that asks for it.
fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "A customer record in JSON, with name, age and address:\n",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "age": {"type": "integer", "minimum": 18, "maximum": 99},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 30},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": false
                    }
                },
                "required": ["name", "age", "address"],
                "additionalProperties": false
            }),
        ),
        (
            "Three colours of the rainbow, as a JSON list:\n",
            json!({
                "type": "array",
                "items": {"type": "string", "enum": ["red", "orange", "yellow", "green", "blue", "violet"]},
                "minItems": 2,
                "maxItems": 4
            }),
        ),
        (
            "The test result as JSON, with a score between 0 and 1:\n",
            json!({
                "type": "object",
                "properties": {
                    "passed": {"type": "boolean"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1}
                },
                "required": ["passed", "score"],
                "additionalProperties": false
            }),
        ),
        (
            "The answer as JSON (a number, or an error object):\n",
            json!({
                "anyOf": [
                    {"type": "integer", "minimum": -1000, "maximum": 1000},
                    {
                        "type": "object",
                        "properties": {"error": {"type": "string", "maxLength": 60}},
                        "required": ["error"],
                        "additionalProperties": false
                    }
                ]
            }),
        ),
        (
            "An order with its items, as JSON:\n",
            json!({
                "$defs": {
                    "item": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 9}
                        },
                        "required": ["sku", "quantity"],
                        "additionalProperties": false
                    }
                },
                "type": "object",
                "properties": {
                    "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3}
                },
                "required": ["items"],
                "additionalProperties": false
            }),
        ),
        (
            "The meeting, as JSON with its date and status:\n",
            json!({
                "type": "object",
                "properties": {
                    "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
                    "status": {"enum": ["planned", "held", "cancelled"]}
                },
                "required": ["date", "status"],
                "additionalProperties": false
            }),
        ),
    ]
}

#[test]
fn schema_answers_validate_at_several_seeds_and_temperatures() {
    let mut lines = Vec::new();
    let mut wanted = Vec::new();
    for (prompt, schema) in schemas() {
        for (temperature, seed) in [(0.0, 0), (0.7, 1), (0.7, 2), (1.0, 3), (1.0, 4)] {
            let mut l = line(prompt, schema_format(&schema));
            l["temperature"] = json!(temperature);
            l["seed"] = json!(seed);
            lines.push(l);
            wanted.push(schema.clone());
        }
    }
    let answers = batch(&lines);
    assert_eq!(answers.len(), lines.len());
    let (mut stopped, mut total) = (0, 0);
    for ((answer, schema), asked) in answers.iter().zip(&wanted).zip(&lines) {
        assert_valid("CompletionResponse", answer);
        let validator = jsonschema::validator_for(schema).unwrap();
        for choice in answer["choices"].as_array().unwrap() {
            total += 1;
            let text = choice["text"].as_str().unwrap();
            if choice["finish_reason"] != "stop" {
                assert_eq!(choice["finish_reason"], "length", "{asked}: {text}");
                continue;
            }
            stopped += 1;
            assert_validates(&validator, text, &asked.to_string());
        }
    }
    assert!(
        stopped * 10 >= total * 8,
        "most answers complete: {stopped} of {total}"
    );
}

/// The schemas of `tests/data/finish/schemas.json` (written for this and
/// never tuned on: objects, enums, bounded and unbounded numbers, strings
/// with and without `maxLength`, arrays, `$ref`, `anyOf`, `oneOf`) at
/// temperatures 0, 0.7 and 1.0, four choices each, `max_tokens` 200, on the
/// test model and on SmolLM2 in its chat format: at least 95% of choices
/// end with `stop` on each, and every one that does validates.
/// (`bench/finish` prints the same figures with where the rest were cut.)
#[test]
fn schemas_a_script_sends_finish_on_two_models() {
    let cases: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/finish/schemas.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(cases.len() >= 10);
    let models = [
        (common::run::model_path(), false),
        (common::run::second_model_path(), true),
    ];
    for (model, chat) in models {
        let mut lines = Vec::new();
        for case in &cases {
            let ask = case["ask"].as_str().unwrap();
            let prompt = if chat {
                format!("<|im_start|>user\nWrite {ask} as a JSON object.<|im_end|>\n<|im_start|>assistant\n")
            } else {
                format!("Here is {ask}, as a JSON object:\n")
            };
            for temperature in [0.0, 0.7, 1.0] {
                let mut l = schema_format(&case["schema"]);
                l["prompt"] = json!(prompt);
                l["max_tokens"] = json!(200);
                // Greedy choices are one answer four times: asked once.
                l["n"] = json!(if temperature == 0.0 { 1 } else { 4 });
                l["temperature"] = json!(temperature);
                l["seed"] = json!(7);
                lines.push((case, l));
            }
        }
        let bodies: Vec<Value> = lines.iter().map(|(_, l)| l.clone()).collect();
        let out = cmpl(&["-m", model.to_str().unwrap(), "--batch"])
            .stdin(jsonl(&bodies))
            .run();
        let (mut stopped, mut total, mut cut) = (0, 0, Vec::new());
        for ((case, _), answer) in lines.iter().zip(out.ok().lines()) {
            let answer: Value = serde_json::from_str(answer).unwrap();
            let validator = jsonschema::validator_for(&case["schema"]).unwrap();
            for choice in answer["choices"].as_array().unwrap() {
                total += 1;
                let text = choice["text"].as_str().unwrap();
                if choice["finish_reason"] != "stop" {
                    cut.push(format!("{}: {text}", case["name"]));
                    continue;
                }
                stopped += 1;
                assert_validates(&validator, text, &case["name"].to_string());
            }
        }
        assert_eq!(total, cases.len() * 9);
        // About 3 in 100 are cut short (docs/structured.md), and which ones
        // moves with the run: each suite times its own decode-call costs, so
        // its drafts, and the rounding at near-ties, are its own. 92% holds
        // that spread (one run cut 5 of 108); the test model finished 90%
        // before loops were ended, and less before the other two defaults.
        assert!(
            stopped * 100 >= total * 92,
            "{}: {stopped} of {total} end with stop; cut short: {cut:#?}",
            model.display()
        );
    }
}

/// The two ways a schema used to run to `max_tokens`: a bounded number's
/// endless decimals (`1.000000…`) and an object with declared properties
/// inventing keys. Both finish and validate, greedy.
#[test]
fn bounded_numbers_and_declared_objects_finish() {
    let cases = [
        (
            "The classifier's confidence that the review is positive, as JSON:\n",
            json!({"type": "object",
                   "properties": {"confidence": {"type": "number", "minimum": 0, "maximum": 1}},
                   "required": ["confidence"]}),
        ),
        (
            "Sherlock Holmes as a JSON record:\n",
            json!({"type": "object",
                   "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
                   "required": ["name", "age", "tags"]}),
        ),
    ];
    for (prompt, schema) in cases {
        let mut l = line(prompt, schema_format(&schema));
        l["max_tokens"] = json!(200);
        l["temperature"] = json!(0);
        let answer = &batch(&[l])[0];
        let choice = &answer["choices"][0];
        let text = choice["text"].as_str().unwrap();
        assert_eq!(choice["finish_reason"], "stop", "{text}");
        let value: Value = serde_json::from_str(text).unwrap();
        assert!(jsonschema::is_valid(&schema, &value), "{text}");
        // Closed: only the declared keys.
        for key in value.as_object().unwrap().keys() {
            assert!(schema["properties"].get(key).is_some(), "{key} in {text}");
        }
        // No run of more than 16 digits (llama.cpp's bound).
        let longest = text
            .split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap();
        assert!(longest <= 16, "{text}");
    }
    // Asked for, the open form: `additionalProperties: true` lets other keys in.
    let open = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                      "required": ["a"], "additionalProperties": true,
                      "minProperties": 2, "maxProperties": 2});
    let mut l = line("A JSON object with two keys:\n", schema_format(&open));
    l["temperature"] = json!(0);
    let answer = &batch(&[l])[0];
    let text = answer["choices"][0]["text"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(value.as_object().unwrap().len(), 2, "{text}");
}

#[test]
fn regexes_match_whole_answers_and_json_objects_parse() {
    let regexes = [
        ("Today's date:", r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"),
        ("Call me at", r" ?\(?[0-9]{3}\)? ?[0-9]{3}-[0-9]{4}"),
        (
            "Is water wet? Answer:",
            r" (Yes|No), because [a-z ,]{1,60}\.",
        ),
        ("The hex colour of the sky is", r" #[0-9a-f]{6}"),
    ];
    let mut lines = Vec::new();
    for (prompt, rx) in regexes {
        for (t, seed) in [(0.0, 0), (0.8, 1), (1.2, 2)] {
            lines.push(line(
                prompt,
                json!({"structured_outputs": {"regex": rx}, "temperature": t, "seed": seed, "max_tokens": 48}),
            ));
        }
    }
    for seed in 0..4 {
        lines.push(line(
            "A JSON object:",
            json!({"response_format": {"type": "json_object"}, "temperature": 0.8, "seed": seed, "max_tokens": 64}),
        ));
    }
    let mut stopped = 0;
    for (answer, asked) in batch(&lines).iter().zip(&lines) {
        let choice = &answer["choices"][0];
        let text = choice["text"].as_str().unwrap();
        if choice["finish_reason"] != "stop" {
            continue;
        }
        stopped += 1;
        match asked["structured_outputs"]["regex"].as_str() {
            Some(rx) => {
                let whole = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
                assert!(whole.is_match(text), "{text:?} does not match {rx}");
            }
            None => {
                let v: Value = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
                assert!(v.is_object(), "{text}");
            }
        }
    }
    assert!(
        stopped >= lines.len() * 3 / 4,
        "{stopped} of {}",
        lines.len()
    );
}

/// Draws among the options follow the model's own probabilities of their
/// tokens, renormalised over the options.
#[test]
fn choices_follow_the_models_probabilities() {
    let prompt = "The weather today will be";
    let options = [" hot", " warm", " sunny", " cold"];
    let probe = cmpl(&[
        "--json",
        "--max-tokens",
        "1",
        "--temperature",
        "0",
        "--logprobs",
        "20",
        prompt,
    ])
    .run();
    let top = probe.json()["choices"][0]["logprobs"]["top_logprobs"][0].clone();
    let p: Vec<f64> = options
        .iter()
        .map(|o| {
            top[*o]
                .as_f64()
                .unwrap_or_else(|| panic!("{o:?} not among {top}"))
                .exp()
        })
        .collect();
    let sum: f64 = p.iter().sum();
    let lines: Vec<Value> = (0..4)
        .map(|seed| {
            line(
                prompt,
                json!({"structured_outputs": {"choice": options}, "n": 128, "seed": seed * 1000, "temperature": 1.0}),
            )
        })
        .collect();
    let mut counts = [0u32; 4];
    let mut total = 0;
    for answer in batch(&lines) {
        for choice in answer["choices"].as_array().unwrap() {
            let text = choice["text"].as_str().unwrap();
            let at = options
                .iter()
                .position(|o| o == &text)
                .unwrap_or_else(|| panic!("{text:?} is not an option"));
            assert_eq!(choice["finish_reason"], "stop");
            counts[at] += 1;
            total += 1;
        }
    }
    assert_eq!(total, 512);
    // Four standard deviations of the binomial count, and 0.02 for the
    // options' other spellings (" h" + "ot"), which the model seldom takes.
    for (i, o) in options.iter().enumerate() {
        let want = p[i] / sum;
        let got = f64::from(counts[i]) / f64::from(total);
        let sd = (want * (1.0 - want) / f64::from(total)).sqrt();
        assert!(
            (got - want).abs() <= 4.0 * sd + 0.02,
            "{o:?}: drawn {got:.3} of the time, the model gives it {want:.3} ({counts:?})"
        );
    }
}

#[test]
fn llama_cpp_grammars_hold_and_greedy_is_the_same_masked_first() {
    let json_gbnf = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/grammars/json.gbnf");
    let arith = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/grammars/arithmetic.gbnf"
    );
    let one = |args: &[&str], env: Option<&str>| {
        // A fixed seed: choices report theirs.
        let mut c = cmpl(args).args(["--seed", "1"]);
        if let Some(v) = env {
            c = c.env("CMPL_GUIDE_MASK_FIRST", v);
        }
        c.run()
    };
    let json_args = [
        "--grammar-file",
        json_gbnf,
        "--temperature",
        "0",
        "--max-tokens",
        "80",
        "--json",
        "A user profile in JSON:\n",
    ];
    let checked = one(&json_args, None).json();
    let masked = one(&json_args, Some("1")).json();
    assert_eq!(
        checked["choices"], masked["choices"],
        "sample-then-check and mask-first agree"
    );
    let choice = &checked["choices"][0];
    let text = choice["text"].as_str().unwrap();
    if choice["finish_reason"] == "stop" {
        let v: Value =
            serde_json::from_str(text.trim_end()).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object());
    }
    // The arithmetic grammar's answer, its whitespace (which the grammar
    // allows almost anywhere, newlines too) taken out: equations, then the
    // start of one where max_tokens cut it.
    let arith_args = [
        "--grammar-file",
        arith,
        "--temperature",
        "0.8",
        "--max-tokens",
        "60",
        "--json",
        "Some sums:\n",
    ];
    let checked = one(&arith_args, None).json();
    let choice = &checked["choices"][0];
    let text: String = choice["text"]
        .as_str()
        .unwrap()
        .chars()
        .filter(|c| !" \t\n".contains(*c))
        .collect();
    let t = r"(?:[a-z][a-z0-9_]*|[0-9]+|\([^=]*\))";
    let e = format!(r"{t}(?:[-+*/]{t})*");
    let cut = if choice["finish_reason"] == "stop" {
        String::new()
    } else {
        format!(r"(?:{e}[-+*/]?|{e}=|\([^=]*)?")
    };
    let sums = regex::Regex::new(&format!(r"^(?:{e}={t})*{cut}$")).unwrap();
    assert!(!text.is_empty() && sums.is_match(&text), "{choice}");
    // Greedy JSON Schema, regex and choice answers are the same masked first.
    for args in [
        vec![
            "--json-schema",
            r#"{"type":"object","properties":{"city":{"enum":["Paris","Rome","Oslo"]},"pop":{"type":"integer"}},"required":["city","pop"]}"#,
        ],
        vec!["--regex", r"[A-Z][a-z]+ (is|was) [0-9]{2,4}\."],
        vec!["--choice", " yes", "--choice", " no", "--choice", " maybe"],
    ] {
        let mut all = args.clone();
        all.extend([
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--json",
            "--logprobs",
            "2",
            "Q: A fact.\nA:",
        ]);
        let a = one(&all, None).json();
        let b = one(&all, Some("1")).json();
        assert_eq!(a["choices"], b["choices"], "{args:?}");
    }
}

#[test]
fn every_face_takes_a_constraint() {
    let schema = r#"{"type":"object","properties":{"answer":{"type":"integer","minimum":0,"maximum":99}},"required":["answer"],"additionalProperties":false}"#;
    // One-shot text, JSON and a stream: the same greedy answer.
    let text = cmpl(&[
        "--json-schema",
        schema,
        "--temperature",
        "0",
        "Q: 2+2?\nA (JSON):",
    ])
    .run();
    let v: Value = serde_json::from_str(text.ok().trim_end()).unwrap();
    assert!(v["answer"].is_i64(), "{v}");
    let sse = cmpl(&[
        "--json-schema",
        schema,
        "--temperature",
        "0",
        "--stream",
        "--json",
        "Q: 2+2?\nA (JSON):",
    ])
    .run();
    let events = sse.sse();
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text.ok().trim_end());
    assert!(events.iter().any(|e| e["finish_reason"] == "stop"));
    // Flags win over the JSON body's constraint, whichever field holds it.
    let body = json!({"prompt": "Q: Is it?\nA:", "structured_outputs": {"regex": "[0-9]+"}, "temperature": 0});
    let out = cmpl(&["--choice", " yes", "--choice", " no"])
        .stdin(body.to_string())
        .run();
    let v = out.json();
    assert!(
        [" yes", " no"].contains(&v["choices"][0]["text"].as_str().unwrap()),
        "{v}"
    );
    // echo, logprobs (the model's own), stop and n together.
    let body = json!({"prompt": "Colours:", "response_format": {"type": "json_object"}, "echo": true, "logprobs": 1,
        "n": 2, "seed": 7, "temperature": 0.9, "stop": ["}"], "max_tokens": 40});
    let v = cmpl(&[]).stdin(body.to_string()).run().json();
    assert_valid("CompletionResponse", &v);
    assert_eq!(v["prompt"][0]["text"], "Colours:", "echo");
    for c in v["choices"].as_array().unwrap() {
        let t = c["text"].as_str().unwrap();
        assert!(t.starts_with('{'), "{t:?}");
        assert!(!t.contains('}'), "the stop string ends the text: {t:?}");
        let lp = c["logprobs"]["token_logprobs"].as_array().unwrap();
        assert!(lp.iter().skip(1).all(|l| l.as_f64().unwrap() <= 0.0));
    }
    // Batch and server: constrained and free requests mixed; the free ones
    // answer as alone.
    let free = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 5});
    let bound = json!({"prompt": "Q: Is Paris in France?\nA:", "structured_outputs": {"choice": [" yes", " no"]}, "temperature": 0});
    let alone = cmpl(&["--json"]).stdin(free.to_string()).run().json();
    let got = batch(&[free.clone(), bound.clone(), free.clone()]);
    follows_single_run(&got[0], &alone);
    follows_single_run(&got[2], &alone);
    assert_eq!(got[1]["choices"][0]["text"], " yes");
    let server = Served::start(&["--parallel", "4"], &[]);
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let bodies = [
            free.to_string(),
            bound.to_string(),
            free.to_string(),
            bound.to_string(),
        ];
        let server = &server;
        let handles: Vec<_> = bodies
            .into_iter()
            .map(|b| s.spawn(move || server.post(&b)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (status, body)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "{body}");
        let v: Value = serde_json::from_str(body).unwrap();
        if i % 2 == 0 {
            follows_single_run(&v, &alone);
        } else {
            assert_eq!(v["choices"][0]["text"], " yes");
        }
    }
    let bad = json!({"prompt": "x", "structured_outputs": {"regex": "(unclosed"}});
    let (status, body) = server.post(&bad.to_string());
    assert_eq!(status, 400, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_valid("ErrorData", &e);
    assert_eq!(e["error"]["param"], "structured_outputs");
}

#[test]
fn bad_constraints_are_refused_by_name() {
    let cases: [(&[&str], &str); 8] = [
        (
            &["--json-schema", "{oops", "x"],
            "--json-schema is not JSON",
        ),
        (
            &["--json-schema", r#"{"type":"wat"}"#, "x"],
            "`--json-schema` holds a JSON Schema that cannot be enforced",
        ),
        (
            &[
                "--json-schema",
                r##"{"type":"object","properties":{"a":{"$ref":"#/nowhere"}}}"##,
                "x",
            ],
            "cannot be enforced",
        ),
        (
            &["--regex", "(a", "x"],
            "`--regex` holds a regex that cannot be enforced",
        ),
        (
            &["--regex", "[", "x"],
            "`--regex` holds a regex that cannot be enforced",
        ),
        (
            &["--grammar", "root ::= \"a\" rest", "x"],
            "rule `rest` is used but never defined",
        ),
        (
            &["--grammar-file", "/nonexistent.gbnf", "x"],
            "--grammar-file /nonexistent.gbnf",
        ),
        (
            &["--regex", "a", "--choice", "b", "x"],
            "cannot be used with",
        ),
    ];
    for (args, want) in cases {
        cmpl(args).run().fails(2, want);
    }
    // A file names the flag, the file and the line.
    let dir = tempfile::tempdir().unwrap();
    let gbnf = dir.path().join("rules.gbnf");
    std::fs::write(&gbnf, "root ::= item+\nitem ::= [a-z]\nbad ::= \"open\n").unwrap();
    let out = cmpl(&["--grammar-file", gbnf.to_str().unwrap(), "x"]).run();
    out.fails(
        2,
        &format!(
            "`--grammar-file {}` holds a grammar that cannot be enforced: line 3: unterminated string",
            gbnf.display()
        ),
    );
    let schema = dir.path().join("s.json");
    std::fs::write(&schema, r#"{"type": "object", "not": {}}"#).unwrap();
    cmpl(&["--json-schema-file", schema.to_str().unwrap(), "x"])
        .run()
        .fails(
            2,
            &format!(
                "`--json-schema-file {}` holds a JSON Schema",
                schema.display()
            ),
        );
    // A body's error names its field, as the API does.
    let body = json!({"prompt": "x", "structured_outputs": {"regex": "["}});
    cmpl(&["--json"]).stdin(body.to_string()).run().fails(
        2,
        "`structured_outputs` holds a regex that cannot be enforced",
    );
    let both = json!({"prompt": "x", "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}});
    cmpl(&["--json"])
        .stdin(both.to_string())
        .run()
        .fails(2, "one constraint per request");
    // A bad line fails alone in a batch.
    let lines = [
        json!({"prompt": "x", "max_tokens": 2, "structured_outputs": {"regex": "["}}),
        json!({"prompt": "x", "max_tokens": 2, "structured_outputs": {"regex": "[ab]"}}),
    ];
    let out = cmpl(&["--batch"]).stdin(jsonl(&lines)).run();
    assert_eq!(out.code, 1, "{}", out.stderr);
    let got: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got[0]["error"]["param"], "structured_outputs");
    assert!(["a", "b"].contains(&got[1]["choices"][0]["text"].as_str().unwrap()));
}

/// What a stranger could send to stall the decode loop: nested repetition,
/// huge bounds, a highly ambiguous grammar. Each is answered (llguidance
/// bounds its work per token), and the batch goes on.
#[test]
fn pathological_constraints_are_bounded() {
    let mut lines: Vec<Value> = [
        r"((a|aa)*)*b",
        r"(a{1,1000}){1,1000}",
        r"[a-z]{100000}",
        r"(x+x+)+y",
    ]
    .iter()
    .map(|rx| {
        line(
            "x",
            json!({"structured_outputs": {"regex": rx}, "max_tokens": 24, "temperature": 0}),
        )
    })
    .collect();
    lines.push(line(
        "x",
        json!({"structured_outputs": {"grammar": "root ::= a\na ::= a a | \"x\" | a \"y\" a"}, "max_tokens": 24, "temperature": 0}),
    ));
    lines.push(line(
        "x",
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": {"type": "array", "minItems": 100000, "items": {"type": "integer"}}}}, "max_tokens": 24, "temperature": 0}),
    ));
    let answers = batch(&lines);
    assert_eq!(answers.len(), lines.len());
    for (a, asked) in answers.iter().zip(&lines) {
        assert_valid("CompletionResponse", a);
        assert!(
            !a["choices"][0]["text"].as_str().unwrap().is_empty(),
            "{asked}: {a}"
        );
    }
}

/// Where the schema fixes the next text (a required key after a value), that
/// text is the draft prompt lookup verifies: taken, and the answer is the
/// text without lookup.
#[test]
fn forced_text_is_drafted_and_the_answer_unchanged() {
    let schema = r#"{"type":"object","properties":{"first_name":{"type":"string","maxLength":12},"last_name":{"type":"string","maxLength":12},"year_of_birth":{"type":"integer","minimum":1900,"maximum":2025},"favourite_colour":{"enum":["red","green","blue"]}},"required":["first_name","last_name","year_of_birth","favourite_colour"],"additionalProperties":false}"#;
    let run = |lookup: &str| {
        cmpl(&[
            "--json-schema",
            schema,
            "--temperature",
            "0",
            "--max-tokens",
            "60",
            "--logprobs",
            "5",
            "--json",
            "--verbose",
            "--lookup",
            lookup,
            "A person, as JSON:",
        ])
        .run()
    };
    let plain = run("0");
    let drafted = run("15");
    // The same text; its tokens may differ where two spellings of the
    // forced text nearly tie (" avour" "it" "e" for "avourite"), which the
    // near-tie rule cannot judge: both lie outside the model's top five.
    let (a, b) = (drafted.json(), plain.json());
    for key in ["text", "finish_reason"] {
        assert_eq!(a["choices"][0][key], b["choices"][0][key], "{key}");
    }
    let line = drafted
        .stderr
        .lines()
        .find(|l| l.contains("lookup: "))
        .unwrap_or_else(|| panic!("{}", drafted.stderr));
    let words: Vec<&str> = line.split_whitespace().collect();
    let accepted: u32 = words[words.iter().position(|w| *w == "drafted,").unwrap() + 1]
        .parse()
        .unwrap();
    assert!(accepted >= 8, "the keys are drafted and taken: {line}");
}
