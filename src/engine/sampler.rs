//! The sampler chain for one choice, built from the request.

use super::draw::{TemperatureDraw, Truncation};
use crate::request::Sampling;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

/// Draws each token of one choice.
pub enum SamplerChain {
    /// Plain greedy: an argmax over the logits, with no per-token copy of
    /// the vocabulary (the common `temperature: 0` case).
    Greedy,
    /// Temperature with or without top-k/top-p/min-p (no penalties or
    /// biases): a draw straight from the logits.
    Temperature(TemperatureDraw),
    /// Penalties or logit biases: llama.cpp's samplers.
    Chain(LlamaSampler),
}

impl SamplerChain {
    pub fn new(s: &Sampling, n_vocab: i32, seed: u32, window: i32) -> SamplerChain {
        let plain = s.logit_bias.is_empty()
            && s.repetition_penalty == 1.0
            && s.presence_penalty == 0.0
            && s.frequency_penalty == 0.0;
        if !plain {
            return SamplerChain::Chain(chain(s, n_vocab, seed, window));
        }
        if s.temperature == 0.0 {
            return SamplerChain::Greedy;
        }
        let truncation = Truncation {
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
        };
        SamplerChain::Temperature(TemperatureDraw::new(s.temperature, truncation, seed))
    }

    /// Tokens already seen (the prompt), for the penalties.
    pub fn accept_many(&mut self, tokens: &[LlamaToken]) {
        if let SamplerChain::Chain(chain) = self {
            chain.accept_many(tokens);
        }
    }

    /// Draws from output `idx` of the last decode and records the token.
    pub fn sample(&mut self, ctx: &LlamaContext, idx: i32) -> LlamaToken {
        match self {
            SamplerChain::Greedy => argmax(ctx.get_logits_ith(idx)),
            SamplerChain::Temperature(draw) => {
                let logits = ctx.get_logits_ith(idx);
                // No finite logit (a broken model): fall back to the argmax.
                draw.sample(logits)
                    .map_or_else(|| argmax(logits), |id| LlamaToken(id as i32))
            }
            SamplerChain::Chain(chain) => chain.sample(ctx, idx),
        }
    }
}

/// The first most likely token, as llama.cpp's greedy sampler picks it.
fn argmax(logits: &[f32]) -> LlamaToken {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    LlamaToken(best as i32)
}

/// Order: penalties, logit_bias, top-k, top-p, min-p, temperature, then a
/// seeded draw; temperature 0 is an argmax after the penalties and biases.
/// `window` is how many past tokens the penalties look at: all of them.
fn chain(s: &Sampling, n_vocab: i32, seed: u32, window: i32) -> LlamaSampler {
    let mut stages = Vec::new();
    if s.repetition_penalty != 1.0 || s.presence_penalty != 0.0 || s.frequency_penalty != 0.0 {
        stages.push(LlamaSampler::penalties(
            n_vocab,
            window,
            s.repetition_penalty,
            s.frequency_penalty,
            s.presence_penalty,
        ));
    }
    if !s.logit_bias.is_empty() {
        let biases: Vec<LlamaLogitBias> = s
            .logit_bias
            .iter()
            .map(|&(id, bias)| LlamaLogitBias::new(LlamaToken(id as i32), bias))
            .collect();
        stages.push(LlamaSampler::logit_bias(n_vocab, &biases));
    }
    if s.temperature == 0.0 {
        stages.push(LlamaSampler::greedy());
        return LlamaSampler::chain_simple(stages);
    }
    if s.top_k > 0 {
        stages.push(LlamaSampler::top_k(s.top_k as i32));
    }
    if s.top_p < 1.0 {
        stages.push(LlamaSampler::top_p(s.top_p, 1));
    }
    if s.min_p > 0.0 {
        stages.push(LlamaSampler::min_p(s.min_p, 1));
    }
    stages.push(LlamaSampler::temp(s.temperature));
    stages.push(LlamaSampler::dist(seed));
    LlamaSampler::chain_simple(stages)
}
