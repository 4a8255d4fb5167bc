//! Reading an answer back into calls, for every family whose calls are
//! JSON: the words before them, the calls (whole, or those written whole
//! before a cut), and where calls open after words. Each family's own
//! wrappers are taken off first ([`super::wrappers`]), so a call reads
//! whatever way the model wrote it (its family's wrapper, bare JSON, a
//! list, a code block).

use crate::tools::{Call, Tools};
use serde_json::Value;

/// The calls an answer holds, where it is one or more calls in any
/// family's format (the constraint made it its model's: wrappers the text
/// kept, whitespace between); `None` for an answer in words, or one cut
/// short (a call's JSON that does not parse whole).
pub fn read_calls(text: &str, tools: &Tools) -> Option<Vec<Call>> {
    if let Some(read) = framed(text, tools) {
        return read.whole.then_some(read.calls);
    }
    let mut text = text.to_string();
    for wrapper in super::wrappers() {
        text = text.replace(wrapper, " ");
    }
    let text = text.trim();
    let values: Vec<Value> = if text.starts_with('[') {
        match serde_json::from_str(text).ok()? {
            Value::Array(items) => items,
            _ => return None,
        }
    } else if text.starts_with('{') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<std::result::Result<_, _>>()
            .ok()?
    } else {
        return None;
    };
    let calls: Option<Vec<Call>> = values.iter().map(|v| call_of(v, tools)).collect();
    calls.filter(|c| !c.is_empty() && (tools.parallel || c.len() == 1))
}

/// `text` read by the framed family whose calls it opens as, if any.
pub fn framed(text: &str, tools: &Tools) -> Option<super::frame::Read> {
    super::frames()
        .map(|frame| frame.read(text, tools))
        .find(|read| read.mine)
}

/// `v` as a call of one of `tools`: its name one of theirs, its arguments
/// an object (under any family's key).
fn call_of(v: &Value, tools: &Tools) -> Option<Call> {
    let name = v.get("name")?.as_str()?;
    let arguments = v.get("arguments").or_else(|| v.get("parameters"))?;
    let callable = tools.callable().iter().any(|t| t.name == name);
    (callable && arguments.is_object()).then(|| Call {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// An answer read as OpenAI answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The words before its calls (none where it opens as a call; trailing
    /// blank space dropped).
    pub lead: Option<String>,
    pub calls: Vec<Call>,
    /// Where the answer was cut short (`length`): what it wrote after its
    /// last whole call (the cut call's text), never a call.
    pub rest: Option<String>,
}

impl Answer {
    /// Its content: the words before the calls, then the cut rest.
    pub fn content(&self) -> Option<String> {
        match (&self.lead, &self.rest) {
            (Some(lead), Some(rest)) => Some(format!("{lead}\n{rest}")),
            (lead, rest) => lead.clone().or_else(|| rest.clone()),
        }
    }
}

/// `text` read as words and calls; `None` for words alone, or calls that
/// do not read whole. An answer `cut` short keeps the calls it wrote whole
/// before the cut (a call is never lost to the length), the rest apart.
pub fn read_answer(text: &str, tools: &Tools, cut: bool) -> Option<Answer> {
    let at = match opens_as_words(text) {
        true => opening_at(text)?,
        false => 0,
    };
    let (calls, rest) = match cut {
        false => (read_calls(&text[at..], tools)?, ""),
        true => whole_calls(&text[at..], tools)?,
    };
    let kept = |t: &str| (!t.is_empty()).then(|| t.to_string());
    Some(Answer {
        lead: kept(text[..at].trim_end()),
        calls,
        rest: kept(rest.trim_end()),
    })
}

/// The calls written whole from the start of `text` (one, where the tools
/// take one), and what follows the last of them: a cut answer's rest, from
/// where its next call began. `None` where no call is whole.
pub fn whole_calls<'a>(text: &'a str, tools: &Tools) -> Option<(Vec<Call>, &'a str)> {
    if let Some(read) = framed(text, tools) {
        let rest = text[read.end..].trim_start();
        return (!read.calls.is_empty()).then_some((read.calls, rest));
    }
    // Wrappers and fences blanked byte for byte, so that offsets hold.
    let mut masked = text.to_string();
    for wrapper in super::wrappers() {
        masked = masked.replace(wrapper, &" ".repeat(wrapper.len()));
    }
    // Blank space, and a list's brackets and commas, between calls.
    let skip = |at: usize| {
        let left =
            masked[at..].trim_start_matches(|c: char| c.is_whitespace() || ",[]".contains(c));
        masked.len() - left.len()
    };
    let (mut calls, mut at) = (Vec::new(), skip(0));
    while masked[at..].starts_with('{') && (tools.parallel || calls.is_empty()) {
        let mut values = serde_json::Deserializer::from_str(&masked[at..]).into_iter::<Value>();
        let Some(call) = values.next().and_then(|v| call_of(&v.ok()?, tools)) else {
            break;
        };
        calls.push(call);
        at = skip(at + values.byte_offset());
    }
    (!calls.is_empty()).then(|| (calls, &text[at..]))
}

/// Where the first call opening after words is, in `text`.
pub fn opening_at(text: &str) -> Option<usize> {
    super::openings().iter().filter_map(|o| text.find(o)).min()
}

/// How much of words written so far may be shown: all but trailing blank
/// space and an end that may begin a call opening (`` ` ``, `<tool_`), held
/// until the next text tells.
pub fn words_shown(text: &str) -> usize {
    let openings = super::openings();
    let longest = openings.iter().map(|o| o.len()).max().unwrap_or(1);
    let partial = (1..=text.len().min(longest - 1))
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k)
                && openings
                    .iter()
                    .any(|o| o.len() > k && o.starts_with(&text[text.len() - k..]))
        })
        .unwrap_or(0);
    text[..text.len() - partial].trim_end().len()
}

/// Whether an answer that opens with `text` is words: it opens as no call
/// does (a brace, a bracket, a tag, or a JSON code block; blank space
/// decides nothing yet), so it may be shown as it comes.
pub fn opens_as_words(text: &str) -> bool {
    const FENCE: &str = "```json";
    let t = text.trim_start();
    match t.chars().next() {
        None | Some('{' | '[' | '<') => false,
        Some(_) => !(FENCE.starts_with(t) || t.starts_with(FENCE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::call_lines;
    use crate::tools::tests::weather;

    #[test]
    fn answers_read_back_as_calls_in_their_format() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let one = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let calls = read_calls(&format!("\n{one}\n"), &t).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let two = format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{one}\n</tool_call>");
        assert_eq!(read_calls(&two, &t).unwrap().len(), 2);
        assert!(read_calls("It is sunny.", &t).is_none());
        assert!(opens_as_words("It") && opens_as_words("`x`") && opens_as_words("```python"));
        assert!(!opens_as_words(" \n") && !opens_as_words("``") && !opens_as_words("```json\n{"));
        assert_eq!(
            call_lines(&calls),
            "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n"
        );
        assert_eq!(
            read_calls(&format!("```json\n{one}\n```"), &t)
                .unwrap()
                .len(),
            1
        );
        assert!(read_calls(r#"{"name": "get_weather", "argu"#, &t).is_none());
        assert!(read_calls(r#"{"name": "rm", "arguments": {}}"#, &t).is_none());
        let llama = r#"{"name": "get_time", "parameters": {}}"#;
        assert_eq!(read_calls(llama, &t).unwrap()[0].arguments, "{}");
        let mistral = format!("[TOOL_CALLS][{one}, {one}]");
        assert_eq!(read_calls(&mistral, &t).unwrap().len(), 2);
        let single = Tools {
            parallel: false,
            ..t
        };
        assert!(read_calls(&two, &single).is_none());
    }

    #[test]
    fn a_cut_answer_keeps_the_calls_it_wrote_whole() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let one = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let cut = r#"{"name": "get_weather", "argu"#;
        // Each family's way: wrapped, a list after its token, bare, fenced.
        for (text, rest) in [
            (format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{cut}"), cut),
            (format!("[TOOL_CALLS][{one}, {one}, {cut}"), cut),
            (format!("{one}\n{one}\n{cut}"), cut),
            (format!("Sure.\n\n```json\n{one}\n```\n```json\n{one}\n```\n```json\n{cut}"), cut),
        ] {
            let answer = read_answer(&text, &t, true).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(answer.calls.len(), 2, "{text}");
            assert_eq!(answer.calls[1].arguments, r#"{"city":"Paris"}"#);
            assert_eq!(answer.rest.as_deref(), Some(rest), "{text}");
        }
        let answer = read_answer(
            &format!("Sure.<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{cut}"),
            &t,
            true,
        )
        .unwrap();
        assert_eq!(answer.content(), Some(format!("Sure.\n{cut}")));
        // Cut after its last call's end: nothing is left over.
        let whole = read_answer(&format!("{one}\n"), &t, true).unwrap();
        assert_eq!((whole.calls.len(), whole.rest), (1, None));
        // No call whole: no call at all, and one call where one is taken.
        assert!(read_answer(&format!("<tool_call>\n{cut}"), &t, true).is_none());
        let single = Tools {
            parallel: false,
            ..t
        };
        let one_only = read_answer(&format!("{one}\n{one}"), &single, true).unwrap();
        assert_eq!(one_only.calls.len(), 1);
        assert_eq!(one_only.rest.as_deref(), Some(one));
    }

    #[test]
    fn words_before_calls_are_their_content() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let one = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let fenced = format!("Here is the call:\n\n```json\n{one}\n```");
        let answer = read_answer(&fenced, &t, false).unwrap();
        assert_eq!(answer.lead.as_deref(), Some("Here is the call:"));
        assert_eq!(answer.calls[0].arguments, r#"{"city":"Paris"}"#);
        let wrapped = format!("Checking.<tool_call>\n{one}\n</tool_call>");
        assert_eq!(
            read_answer(&wrapped, &t, false).unwrap().lead.as_deref(),
            Some("Checking.")
        );
        assert_eq!(read_answer(one, &t, false).unwrap().lead, None);
        assert!(read_answer("It is sunny.", &t, false).is_none());
        assert!(read_answer("See ```json\n{\"x\": 1}\n``` for more", &t, false).is_none());
        // Shown as they come, but for blank space and a possible opening.
        assert_eq!(
            words_shown("Here is the call:\n\n``"),
            "Here is the call:".len()
        );
        assert_eq!(words_shown("It is <tool_"), "It is".len());
        assert_eq!(words_shown("a < b"), "a < b".len());
        assert_eq!(words_shown("café"), "café".len());
        assert_eq!(opening_at("x [TOOL_CALLS]["), Some(2));
    }
}
