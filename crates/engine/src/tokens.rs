//! The model's tokenizer as a face offers it (`cmpl --tokenize`, a server's
//! `/tokenize`, `/detokenize` and `/tokenizer_info`): text to ids as a
//! prompt is tokenized, ids back to text, and what a client needs to know
//! of the vocabulary.

use crate::Engine;
use cmpl_core::error::{CmplError, Result};
use llama_cpp_2::token::LlamaToken;

/// What a client of the tokenizer needs to know of it (vLLM's
/// `/tokenizer_info`, as evaluation harnesses read it).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenizerInfo {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub chat_template: Option<String>,
    pub model_max_length: u32,
    pub vocab_size: u32,
}

impl Engine {
    /// `text` as the model's ids, tokenized as a prompt is (special tokens
    /// parsed), with the model's BOS where `add_special` and the model adds
    /// one. A text that is surely longer than the model's context is
    /// refused by its length alone, before any work (`field` names it).
    pub fn tokens_of(&self, text: &str, add_special: bool, field: &str) -> Result<Vec<i32>> {
        let window = self.n_ctx_train() as usize;
        let at_least = text.len() / self.longest_piece();
        if at_least > window {
            return Err(CmplError::invalid(
                field,
                format!(
                    "the text is {} bytes, at least {at_least} tokens, past the model's context of {window}; send less",
                    text.len()
                ),
            ));
        }
        let vocab = self.model.vocab();
        let mut tokens = vocab.tokenize(text.as_bytes(), false, true);
        if add_special && vocab.should_add_bos() && tokens.first() != Some(&vocab.bos()) {
            tokens.insert(0, vocab.bos());
        }
        Ok(tokens.into_iter().map(|t| t.0).collect())
    }

    /// The text `ids` make (special tokens written out); an id outside the
    /// vocabulary is refused by its index in `field`.
    pub fn text_of(&self, ids: &[i64], field: &str) -> Result<String> {
        let n_vocab = i64::from(self.model.n_vocab());
        let tokens = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| match (0..n_vocab).contains(&id) {
                true => Ok(LlamaToken(id as i32)),
                false => Err(CmplError::invalid(
                    field,
                    format!(
                        "`{field}[{i}]` is {id}, and this model's vocabulary has ids 0 to {}",
                        n_vocab - 1
                    ),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.text_of_tokens(&tokens))
    }

    /// The text tokens already checked against the vocabulary make
    /// (special tokens written out), as [`Engine::text_of`] gives it.
    pub(crate) fn text_of_tokens(&self, tokens: &[LlamaToken]) -> String {
        let vocab = self.model.vocab();
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| vocab.token_to_piece(t, true, None))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The vocabulary's special tokens, the model's chat template and context.
    pub fn tokenizer_info(&self) -> TokenizerInfo {
        let vocab = self.model.vocab();
        let n_vocab = self.model.n_vocab();
        // A file may name a special token past its vocabulary (llama.cpp
        // ignores it): no such token is read.
        let text = |token: LlamaToken| {
            (0..n_vocab).contains(&token.0).then(|| {
                String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned()
            })
        };
        let pad = self
            .info
            .get_u64("tokenizer.ggml.padding_token_id")
            .and_then(|id| i32::try_from(id).ok())
            .and_then(|id| text(LlamaToken(id)));
        TokenizerInfo {
            bos_token: text(vocab.bos()),
            eos_token: text(vocab.eos()),
            pad_token: pad,
            chat_template: self
                .info
                .get_str("tokenizer.chat_template")
                .map(str::to_string),
            model_max_length: self.n_ctx_train(),
            vocab_size: self.model.n_vocab() as u32,
        }
    }
}
