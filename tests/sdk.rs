//! The official Python SDK (`together`) parses what cmpl prints.

use crate::common;
use common::run::cmpl;
use common::sdk::assert_sdk_parses;

#[test]
fn the_official_sdk_parses_responses_and_chunks() {
    let mut lines = String::new();
    let prompt = "The capital of France is";
    let response = cmpl(&[
        prompt,
        "--max-tokens",
        "4",
        "--json",
        "--echo",
        "--logprobs",
        "2",
        "-n",
        "2",
    ])
    .run();
    lines += &format!("response\t{}", response.ok());
    let streamed = cmpl(&[
        prompt,
        "--max-tokens",
        "4",
        "--json",
        "--stream",
        "--logprobs",
        "1",
    ])
    .run();
    streamed.ok();
    for chunk in streamed.sse() {
        lines += &format!("chunk\t{chunk}\n");
    }
    let batch = cmpl(&["--batch"])
        .stdin(r#"{"prompt": "Hi", "max_tokens": 2}"#)
        .run();
    lines += &format!("response\t{}", batch.ok());

    assert_sdk_parses(&lines);
}
