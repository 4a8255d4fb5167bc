//! The API's response shapes, field for field (the contract's schemas are
//! in `tests/schema/completions.schema.json`).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop sequence matched.
    Stop,
    /// The model produced its end-of-generation token.
    Eos,
    /// `max_tokens` or the context window was reached.
    Length,
    /// The answer is calls of the request's tools (`tool_calls`).
    ToolCalls,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LogprobsPart {
    pub tokens: Vec<String>,
    pub token_ids: Vec<i32>,
    /// `None` only for a prompt's first token, which has no context.
    pub token_logprobs: Vec<Option<f32>>,
    /// One map per position when `logprobs` > 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TopLogprobs>>,
    /// Each token's offset, in characters, in the text it belongs to (the
    /// choice's, or the echoed prompt's), as OpenAI's completions give it.
    pub text_offset: Vec<usize>,
}

/// One position's alternatives: a JSON object whose keys come best first,
/// as the hosted API and OpenAI list them (a map would sort them by name).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobs(Vec<(String, f32)>);

impl TopLogprobs {
    /// Sorts `top` best first; a text that two tokens share keeps its best.
    pub fn new(mut top: Vec<(String, f32)>) -> TopLogprobs {
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut seen = std::collections::HashSet::new();
        top.retain(|(text, _)| seen.insert(text.clone()));
        TopLogprobs(top)
    }
}

impl Serialize for TopLogprobs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (text, logprob) in &self.0 {
            map.serialize_entry(text, logprob)?;
        }
        map.end()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    pub text: String,
    /// A thinking model's reasoning, apart from the answer in `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    pub finish_reason: FinishReason,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsPart>,
    /// The calls the text reads as, where the request offered tools.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<IndexedToolCall>,
}

/// A call in a completion's choice, as the contract's `ToolChoice`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexedToolCall {
    pub index: u32,
    #[serde(flatten)]
    pub call: ToolCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptPart {
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsPart>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub prompt: Vec<PromptPart>,
    pub usage: Usage,
}

/// One Server-Sent Event of a stream (`CompletionChunk`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub token: ChunkToken,
    pub choices: Vec<ChunkChoice>,
    pub finish_reason: Option<FinishReason>,
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkToken {
    pub id: i32,
    pub text: String,
    pub logprob: f32,
    pub special: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub text: String,
    /// The reasoning this chunk adds (a thinking model's), beside `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The contract's chat-style delta; left out for OpenAI's stream
    /// protocol (see `Request::openai_stream`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChunkDelta>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkDelta {
    pub role: &'static str,
    pub token_id: i32,
    pub content: String,
    /// The contract's name for the reasoning a chunk adds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// Identity shared by a response or all chunks of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseHeader {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHeader {
    pub fn new(model: &str) -> ResponseHeader {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        ResponseHeader {
            id: format!(
                "cmpl-{:016x}{:016x}",
                crate::random::u64(),
                crate::random::u64()
            ),
            created,
            model: model.to_string(),
        }
    }
}

/// Why a chat choice ended: its turn (an end of turn, a stop string, a
/// constraint complete), its length, or calls for the client to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatFinishReason {
    Stop,
    Length,
    ToolCalls,
}

/// A chat answer whole (`chat.completion`), as OpenAI's chat endpoint
/// writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: ChatFinishReason,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: &'static str,
    /// The answer; `null` where the answer is calls.
    pub content: Option<String>,
    /// A thinking model's reasoning, apart from the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One call an answer asks the client to make.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A piece of a streamed call: its id, kind and name first, then its
/// arguments' text, as the SDKs' stream helpers join them (by `index`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// One event of a chat stream (`chat.completion.chunk`); the last one of a
/// stream with `stream_options.include_usage` has no choices and the usage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<ChatFinishReason>,
}

/// A choice's new text; its first chunk also carries the role.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// `logprobs.content`: one entry per token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The alternatives, best first.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}
