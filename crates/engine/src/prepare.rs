//! A request made ready for the decode loop: checked against the model,
//! its chat rendered by the model's template, tokenized, and sized to the
//! cells it may hold.

use crate::{guide, Cells, Engine, Job};
use cmpl_core::constraint::Constraint;
use cmpl_core::error::{CmplError, Result};
use cmpl_core::fields;
use cmpl_core::request::Request;
use llama_cpp_2::token::LlamaToken;

impl Engine {
    /// Bytes of the vocabulary's longest token.
    pub(crate) fn longest_piece(&self) -> usize {
        *self.state.longest_piece.get_or_init(|| {
            let vocab = self.model.vocab();
            (0..self.model.n_vocab())
                .map(|id| vocab.token_to_piece(LlamaToken(id), true, None).len())
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    /// What compiles constraints for this model: its vocabulary as a token
    /// trie, built once (262k tokens here: see the README's figures).
    pub(crate) fn guides(&self) -> Result<&guide::Guides> {
        self.state
            .guides
            .get_or_init(|| {
                let started = std::time::Instant::now();
                let guides = guide::pieces(&self.model, self.threads.max(1) as usize)
                    .and_then(|(words, ends)| guide::Guides::new(words, &ends));
                if self.verbose {
                    eprintln!(
                        "cmpl: structured output: token trie of {} tokens built in {} ms",
                        self.model.n_vocab(),
                        started.elapsed().as_millis()
                    );
                }
                guides
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Literal text as the model's tokens (no BOS, special tokens not parsed).
    pub(crate) fn tokenize_text(&self, text: &[u8]) -> Vec<i32> {
        self.model
            .vocab()
            .tokenize(text, false, false)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    /// Tokenizes the prompt (special tokens parsed) and adds BOS when the
    /// model asks for it and the prompt does not already start with it.
    pub(crate) fn tokenize(&self, prompt: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = vocab.tokenize(prompt.as_bytes(), false, true);
        if vocab.should_add_bos() && tokens.first() != Some(&vocab.bos()) {
            tokens.insert(0, vocab.bos());
        }
        tokens
    }

    /// A chat request as the model reads it: its conversation rendered by
    /// the model's chat template (or the one the request gives) into the
    /// prompt, and the template's end of turn a stop, for a model that
    /// writes it as text. Once: a request rendered already (a server renders
    /// on a thread of its own, off the decode loop) passes as it is.
    pub fn render_chat(&self, mut request: Request) -> Result<Request> {
        let Some(chat) = request.chat.as_ref().filter(|c| !c.rendered) else {
            return Ok(request);
        };
        let source = match (&chat.template, self.info.get_str("tokenizer.chat_template")) {
            (Some(given), _) => given.clone(),
            (None, Some(own)) => own.to_string(),
            (None, None) => {
                return Err(CmplError::invalid(
                    fields::CHAT_TEMPLATE.name,
                    format!(
                        "{} has no chat template (a base model, or no tokenizer.chat_template in its GGUF); give one with --chat-template FILE, or leave out --chat and write the prompt as the model expects it",
                        self.model_ref.name
                    ),
                ))
            }
        };
        let vocab = self.model.vocab();
        let text = |token: LlamaToken| {
            if token.0 < 0 {
                return String::new();
            }
            String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned()
        };
        let (bos, eos) = (text(vocab.bos()), text(vocab.eos()));
        let specials = cmpl_core::template::Specials {
            bos: &bos,
            eos: &eos,
        };
        // No prompt longer than the model's context in bytes can be run.
        let limit = (self.n_ctx_train() as usize)
            .saturating_mul(cmpl_core::template::BYTES_PER_TOKEN)
            .max(1 << 20);
        request.render_chat(&source, specials, limit)?;
        Ok(request)
    }

    /// Checks `request` against this model and sizes it to `cells` and the
    /// model's training context.
    pub(crate) fn prepare(
        &self,
        request: Request,
        cells: Cells,
        token_logprob: bool,
    ) -> Result<Job> {
        self.model_ref.check(request.model.as_deref())?;
        let mut request = self.render_chat(request)?;
        let n_vocab = self.model.n_vocab() as i64;
        if let Some(&(id, _)) = request
            .sampling
            .logit_bias
            .iter()
            .find(|(id, _)| *id >= n_vocab)
        {
            return Err(CmplError::invalid(
                fields::LOGIT_BIAS.name,
                format!(
                    "`logit_bias` names token {id}, but this model's vocabulary has ids 0 to {}",
                    n_vocab - 1
                ),
            ));
        }
        let window = self.n_ctx_train();
        let (limit, holder, fix) = match cells {
            Cells::Any => (window, "the model's context", ""),
            Cells::Pool(c) => (c.min(window), "--ctx-size", " or raise --ctx-size"),
            Cells::Slot(c) => (
                c.min(window),
                "a slot (--ctx-size over --parallel)",
                " or raise --ctx-size",
            ),
        };
        let tokens = match request.prompt_ids.as_deref() {
            Some(ids) => self.given_tokens(ids, limit, holder)?,
            None => self.prompt_tokens(&request.prompt, limit, holder)?,
        };
        if request.prompt_ids.is_some() {
            // What echo shows: the text the ids make.
            request.prompt = self.text_of_tokens(&tokens);
        }
        let n_prompt = tokens.len() as u32;
        // Each choice's positions end at the model's window (or its slot's
        // end); in a pool, the choices also share the cells after the prompt's.
        let room = match cells {
            Cells::Pool(c) => limit
                .saturating_sub(n_prompt)
                .min(c.saturating_sub(n_prompt) / request.n),
            Cells::Any | Cells::Slot(_) => limit.saturating_sub(n_prompt),
        };
        // Scoring a prompt alone (`max_tokens` 0) needs no room after it.
        if room == 0 && request.max_tokens > 0 {
            let pooled = matches!(cells, Cells::Pool(_)) && request.n > 1;
            return Err(CmplError::context(format!(
                "the prompt is {n_prompt} tokens and {holder} holds {limit}, which leaves no room to generate{}; shorten the prompt{fix}",
                if pooled { format!(" {} choices", request.n) } else { String::new() },
            ))
            .with_param(fields::PROMPT.name));
        }
        let guide = match &request.constraint {
            // bench/tools' baseline: the same calls read back from a free decode.
            Some(Constraint::Tools { .. }) if tools_unconstrained() => None,
            Some(c) => Some(self.guides()?.compile(c)?),
            None => None,
        };
        let base = request
            .seed
            .unwrap_or_else(|| cmpl_core::random::u64() as u32);
        Ok(Job {
            guide,
            seeds: (0..request.n).map(|i| base.wrapping_add(i)).collect(),
            budget: request.max_tokens.min(room),
            tokens,
            request,
            token_logprob,
        })
    }
}

impl Engine {
    /// A text prompt's tokens (special tokens parsed, the model's BOS
    /// added), refused where they cannot fit `limit`.
    fn prompt_tokens(&self, prompt: &str, limit: u32, holder: &str) -> Result<Vec<LlamaToken>> {
        // Tokenizing a huge prompt takes minutes; its byte length alone can
        // prove it too long (no token is longer than the longest vocab piece).
        let bytes = prompt.len();
        if bytes > limit as usize {
            let at_least = bytes / self.longest_piece();
            if at_least >= limit as usize {
                return Err(CmplError::context(format!(
                    "the prompt is {bytes} bytes, at least {at_least} tokens, and {holder} holds {limit}; shorten the prompt"
                ))
                .with_param(fields::PROMPT.name));
            }
        }
        let tokens = self.tokenize(prompt);
        if tokens.is_empty() {
            // Nothing to condition on: a draw would read stale or no logits.
            return Err(CmplError::invalid(
                fields::PROMPT.name,
                "the prompt tokenizes to no tokens with this model (which adds no BOS); give some text to complete",
            ));
        }
        Ok(tokens)
    }

    /// A prompt of token ids, exactly as given: each in the vocabulary
    /// (refused by its index), all within `limit`.
    fn given_tokens(&self, ids: &[i32], limit: u32, holder: &str) -> Result<Vec<LlamaToken>> {
        if ids.len() > limit as usize {
            return Err(CmplError::context(format!(
                "the prompt is {} token ids and {holder} holds {limit}; shorten the prompt",
                ids.len()
            ))
            .with_param(fields::PROMPT.name));
        }
        let n_vocab = self.model.n_vocab();
        if let Some(i) = ids.iter().position(|&id| id >= n_vocab) {
            return Err(CmplError::invalid(
                fields::PROMPT.name,
                format!(
                    "`prompt[{i}]` is token {}, and this model's vocabulary has ids 0 to {}",
                    ids[i],
                    n_vocab - 1
                ),
            ));
        }
        Ok(ids.iter().map(|&id| LlamaToken(id)).collect())
    }
}

/// `CMPL_TOOLS_UNCONSTRAINED=1`: tool calls decoded without their
/// constraint, for measurements (bench/tools' parse rate without it).
fn tools_unconstrained() -> bool {
    std::env::var_os("CMPL_TOOLS_UNCONSTRAINED").is_some_and(|v| v == "1")
}
