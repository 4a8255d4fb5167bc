//! The flags, over the config file's runtime keys and the environment,
//! resolved into the [`Invocation`] the rest of the program runs on: its
//! action, its runtime settings, and its request fields as JSON values
//! (so that a flag meets the same checks as a JSON field).

use super::values::{parse_duration, serve_addr};
use super::{clap_message, clap_param, Cli};
use crate::config::Config;
use crate::constraint::Constraint;
use crate::error::{CmplError, Result};
use crate::fields;
use crate::options::{Action, InputSource, Invocation, RunSettings, ServeOptions};
use crate::remote::Endpoint;
use crate::request::RawRequest;
use clap::Parser;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The config file's runtime keys, each the flag of the same name.
pub const CONFIG_RUNTIME_KEYS: &[&str] = &[
    "threads",
    "n_gpu_layers",
    "rpc",
    "ctx_size",
    "parallel",
    "lookup",
    "deterministic",
    "base_url",
    "connect_timeout",
    "read_timeout",
    "keep_alive",
    "compat",
];

/// Defaults of the remote engine's timeouts, in seconds.
const CONNECT_TIMEOUT: u64 = 10;
const READ_TIMEOUT: u64 = 600;

impl Cli {
    /// Resolves the flags, over `config`'s runtime settings, into what the
    /// rest of the program runs on.
    pub fn resolve(self, config: &Config) -> Result<Invocation> {
        let from_config = runtime_from_config(config)?;
        // The flag, then the environment, then the config file.
        let from_env = std::env::var("CMPL_KEEP_ALIVE")
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| {
                parse_duration(&v)
                    .map_err(|e| CmplError::invalid("keep_alive", format!("CMPL_KEEP_ALIVE: {e}")))
            })
            .transpose()?;
        let keep_alive = self.keep_alive.or(from_env).or(from_config.keep_alive);
        let compat = self.compat.or(from_config.compat).unwrap_or_default();
        let action = if self.version {
            Action::Version
        } else if let Some(kind) = self.generate {
            Action::Generate(kind)
        } else if self.list_models {
            Action::ListModels
        } else if matches!(self.models_dir, Some(None)) {
            Action::ModelsDir
        } else if self.ps {
            Action::Ps
        } else if let Some(which) = &self.stop_resident {
            Action::Stop(which.clone())
        } else if let Some(text) = &self.tokenize {
            Action::Tokenize(text.clone())
        } else if let Some(file) = &self.batch {
            Action::Batch(crate::options::BatchFiles {
                input: file.clone(),
                output: self.output.clone(),
            })
        } else if let Some(addr) = &self.serve {
            Action::Serve(ServeOptions {
                listen: serve_addr(addr)?,
                parallel: self.parallel.or(from_config.parallel),
                ctx_size: self.ctx_size.or(from_config.ctx_size),
                strict_model: self.server.strict_model,
                trust_request_templates: self.server.trust_request_templates,
                drain: std::time::Duration::from_secs(
                    self.server
                        .drain_timeout
                        .unwrap_or(crate::options::DEFAULT_DRAIN_SECS),
                ),
                keep_alive: keep_alive.filter(|d| !d.is_zero()),
                queue_memory: self.server.queue_memory,
                queue_timeout: Duration::from_secs(
                    self.server
                        .queue_timeout
                        .unwrap_or(crate::options::DEFAULT_QUEUE_SECS),
                ),
                compat,
                ready_pipe: std::env::var_os("CMPL_RESIDENT_READY").is_some(),
                models: self.model.clone(),
                models_dir: self.models_dir.clone().flatten(),
                models_max: self.server.models_max.map(|n| n as usize),
                models_memory: self.server.models_memory,
                models_idle: self.server.models_idle,
                pin: self.server.pin.clone(),
            })
        } else {
            Action::Complete
        };
        let serving = matches!(action, Action::Serve(_));
        if self.model.len() > 1 && !serving {
            return Err(CmplError::invalid(
                fields::MODEL.name,
                format!("-m is given {} times; several models are served with --serve, and a run uses one: give -m once", self.model.len()),
            ));
        }
        if let (Some(flag), false) = (self.server.given(), serving) {
            return Err(CmplError::invalid(
                &flag.trim_start_matches('-').replace('-', "_"),
                format!("{flag} applies to a server: add --serve, or drop {flag}"),
            ));
        }
        if let (Some(Some(dir)), false) = (&self.models_dir, serving) {
            return Err(CmplError::invalid(
                "models_dir",
                format!("--models-dir {} serves the models there and needs --serve; without DIR it prints the models folder", dir.display()),
            ));
        }
        // The flags, else the environment's, else the config's.
        let base_urls = [
            self.base_url.clone(),
            std::env::var("CMPL_BASE_URL")
                .ok()
                .filter(|u| !u.is_empty())
                .into_iter()
                .collect(),
            from_config.base_url,
        ]
        .into_iter()
        .find(|urls| !urls.is_empty())
        .unwrap_or_default();
        if !base_urls.is_empty() {
            // A flag that would do nothing is an error, not a no-op.
            let local_only = [
                ("--threads", self.threads.is_some()),
                ("--ctx-size", self.ctx_size.is_some()),
                ("--n-gpu-layers", self.n_gpu_layers.is_some()),
                ("--rpc", !self.rpc.is_empty()),
                ("--no-repack", self.no_repack),
                ("--lookup", self.lookup.is_some()),
                ("--no-prefix-cache", self.no_prefix_cache),
                ("--deterministic", self.deterministic),
            ];
            let local_only = [
                local_only.as_slice(),
                &[("--keep-alive", self.keep_alive.is_some())],
            ]
            .concat();
            if let Some((flag, _)) = local_only.iter().find(|(_, given)| *given) {
                return Err(CmplError::invalid(
                    &flag.trim_start_matches('-').replace('-', "_"),
                    format!("{flag} applies to a local model; with --base-url the server decides it: drop {flag}"),
                ));
            }
        }
        let remote = (!base_urls.is_empty()).then(|| Endpoint {
            base_urls,
            connect_timeout: Duration::from_secs(
                self.connect_timeout
                    .or(from_config.connect_timeout)
                    .unwrap_or(CONNECT_TIMEOUT),
            ),
            read_timeout: Duration::from_secs(
                self.read_timeout
                    .or(from_config.read_timeout)
                    .unwrap_or(READ_TIMEOUT),
            ),
        });
        // Read once (a file flag's file too), checked here for a local
        // engine, written into the request below.
        let constraint = self.constraint()?;
        if let (None, Some(c)) = (&remote, &constraint) {
            self.check_constraint(c)?;
        }
        // A JSON request or a batch is answered in JSON, errors included.
        let json = self.json || self.request.is_some() || matches!(action, Action::Batch(_));
        let rpc = if self.rpc.is_empty() {
            from_config.rpc
        } else {
            self.rpc.clone()
        };
        let deterministic = self.deterministic || from_config.deterministic;
        if deterministic && !rpc.is_empty() {
            // The servers' kernels are theirs to choose (a GPU's, or tiled
            // CPU ones that round by batch shape): no promise to keep.
            return Err(CmplError::invalid(
                "rpc",
                "--deterministic promises the bytes of a request alone, which layers on --rpc servers (their own kernels) cannot keep; drop one of them",
            ));
        }
        Ok(Invocation {
            flags: self.request_fields(constraint)?,
            input: InputSource {
                prompt: self.prompt,
                request_file: self.request,
                prompt_file: self.prompt_file,
            },
            runtime: RunSettings {
                threads: self.threads.or(from_config.threads),
                n_gpu_layers: self.n_gpu_layers.or(from_config.n_gpu_layers),
                rpc,
                ctx_size: self.ctx_size.or(from_config.ctx_size),
                parallel: self.parallel.or(from_config.parallel),
                repack: !self.no_repack,
                lookup: self.lookup.or(from_config.lookup),
                prefix_cache: !self.no_prefix_cache,
                deterministic,
                verbose: self.verbose,
                remote,
                keep_alive,
            },
            json,
            color: self.color,
            reasoning: self.reasoning,
            compat,
            action,
        })
    }

    /// The request fields given as flags, as JSON values, so they meet the
    /// same checks as a JSON request. (PROMPT is input, not a field flag.)
    fn request_fields(&self, constraint: Option<Constraint>) -> Result<RawRequest> {
        let mut raw = RawRequest::default();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(v) = value {
                raw.set(key, v);
            }
        };
        // A non-finite flag value (NaN, inf) is reported under its own field name.
        let float_for = |key: &str, x: Option<f64>| -> Result<Option<Value>> {
            x.map(|x| {
                serde_json::Number::from_f64(x)
                    .map(Value::Number)
                    .ok_or_else(|| {
                        CmplError::invalid(key, format!("`{key}` must be a finite number, got {x}"))
                    })
            })
            .transpose()
        };
        put(
            fields::MODEL.name,
            self.model.first().cloned().map(Value::String),
        );
        put(fields::MAX_TOKENS.name, self.max_tokens.map(|v| json!(v)));
        if !self.stop.is_empty() {
            put(fields::STOP.name, Some(json!(self.stop)));
        }
        put(
            fields::TEMPERATURE.name,
            float_for(fields::TEMPERATURE.name, self.temperature)?,
        );
        put(
            fields::TOP_P.name,
            float_for(fields::TOP_P.name, self.top_p)?,
        );
        put(fields::TOP_K.name, self.top_k.map(|v| json!(v)));
        put(
            fields::REPETITION_PENALTY.name,
            float_for(fields::REPETITION_PENALTY.name, self.repetition_penalty)?,
        );
        put(fields::STREAM.name, self.stream.map(Value::Bool));
        put(fields::LOGPROBS.name, self.logprobs.map(|v| json!(v)));
        put(fields::ECHO.name, self.echo.map(Value::Bool));
        put(fields::N.name, self.n.map(|v| json!(v)));
        put(
            fields::SAFETY_MODEL.name,
            self.safety_model.clone().map(Value::String),
        );
        put(
            fields::MIN_P.name,
            float_for(fields::MIN_P.name, self.min_p)?,
        );
        put(
            fields::PRESENCE_PENALTY.name,
            float_for(fields::PRESENCE_PENALTY.name, self.presence_penalty)?,
        );
        put(
            fields::FREQUENCY_PENALTY.name,
            float_for(fields::FREQUENCY_PENALTY.name, self.frequency_penalty)?,
        );
        put(fields::SEED.name, self.seed.map(|v| json!(v)));
        put(fields::CHAT.name, self.chat.map(Value::Bool));
        put(fields::SYSTEM.name, self.system.clone().map(Value::String));
        if let Some(path) = &self.chat_template {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CmplError::invalid(
                    fields::CHAT_TEMPLATE.name,
                    format!("--chat-template {}: {e}", path.display()),
                )
            })?;
            put(fields::CHAT_TEMPLATE.name, Some(Value::String(text)));
        }
        if let Some(path) = &self.tools {
            let tools = std::fs::read_to_string(path).map_err(|e| {
                CmplError::invalid(
                    fields::TOOLS.name,
                    format!("--tools {}: {e}", path.display()),
                )
            })?;
            let tools: Value = serde_json::from_str(&tools).map_err(|e| {
                CmplError::invalid(
                    fields::TOOLS.name,
                    format!("--tools {}: not JSON ({e}); give a list like [{{\"type\": \"function\", \"function\": {{\"name\": \"get_weather\", \"parameters\": {{…}}}}}}]", path.display()),
                )
            })?;
            put(fields::TOOLS.name, Some(tools));
        }
        put(
            fields::TOOL_CHOICE.name,
            self.tool_choice.as_deref().map(|c| match c {
                "auto" | "none" | "required" => json!(c),
                name => json!({"type": "function", "function": {"name": name}}),
            }),
        );
        put(
            fields::PARALLEL_TOOL_CALLS.name,
            self.parallel_tool_calls.map(Value::Bool),
        );
        let think = match (self.think, self.no_think) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        put(fields::THINK.name, think.map(Value::Bool));
        put(
            fields::REASONING_BUDGET.name,
            self.reasoning_budget.map(|n| json!(n)),
        );
        if !self.logit_bias.is_empty() {
            let mut map = Map::new();
            for item in &self.logit_bias {
                let parsed = item.split_once('=').and_then(|(id, bias)| {
                    Some((id.trim().to_string(), bias.trim().parse::<f64>().ok()?))
                });
                let Some((id, bias)) = parsed else {
                    return Err(CmplError::invalid(
                        fields::LOGIT_BIAS.name,
                        format!("--logit-bias {item:?} is not ID=BIAS; write it like --logit-bias 1024=-10.5"),
                    ));
                };
                map.insert(
                    id,
                    float_for(fields::LOGIT_BIAS.name, Some(bias))?.unwrap_or_default(),
                );
            }
            put(fields::LOGIT_BIAS.name, Some(Value::Object(map)));
        }
        if let Some(c) = constraint {
            let (field, value) = c.to_field();
            put(field, Some(value));
        }
        Ok(raw)
    }
}

impl Cli {
    /// The structured-output flag given (clap lets one through), as the
    /// constraint its request field carries.
    fn constraint(&self) -> Result<Option<Constraint>> {
        let read = |path: &PathBuf, flag: &str, field: &str| {
            std::fs::read_to_string(path)
                .map_err(|e| CmplError::invalid(field, format!("{flag} {}: {e}", path.display())))
        };
        let schema = |text: &str, flag: &str| {
            serde_json::from_str(text).map(Constraint::JsonSchema).map_err(|e| {
                CmplError::invalid(
                    fields::RESPONSE_FORMAT.name,
                    format!("{flag} is not JSON: {e}; give a JSON Schema like '{{\"type\": \"object\"}}'"),
                )
            })
        };
        let c = if let Some(text) = &self.json_schema {
            schema(text, "--json-schema")?
        } else if let Some(path) = &self.json_schema_file {
            schema(
                &read(path, "--json-schema-file", fields::RESPONSE_FORMAT.name)?,
                "--json-schema-file",
            )?
        } else if self.json_object {
            Constraint::JsonObject
        } else if let Some(rx) = &self.regex {
            Constraint::Regex(rx.clone())
        } else if !self.choice.is_empty() {
            Constraint::Choice(self.choice.clone())
        } else if let Some(g) = &self.grammar {
            Constraint::Grammar(g.clone())
        } else if let Some(path) = &self.grammar_file {
            Constraint::Grammar(read(
                path,
                "--grammar-file",
                fields::STRUCTURED_OUTPUTS.name,
            )?)
        } else {
            return Ok(None);
        };
        // Checked with the request it is written into, as a JSON field is.
        Ok(Some(c))
    }

    /// A structured-output flag that cannot be enforced is refused in the
    /// flag's words, with the file where one holds it (a remote engine
    /// says what it enforces in its own).
    fn check_constraint(&self, c: &Constraint) -> Result<()> {
        let Some(why) = crate::engine::unenforceable(c) else {
            return Ok(());
        };
        let file = |flag: &str, path: &Option<PathBuf>| {
            path.as_ref().map(|p| format!("{flag} {}", p.display()))
        };
        let flag = file("--json-schema-file", &self.json_schema_file)
            .or_else(|| file("--grammar-file", &self.grammar_file))
            .unwrap_or_else(|| {
                match c {
                    Constraint::JsonSchema(_) => "--json-schema",
                    Constraint::JsonObject => "--json-object",
                    Constraint::Regex(_) => "--regex",
                    Constraint::Choice(_) => "--choice",
                    Constraint::Grammar(_) => "--grammar",
                    Constraint::Tools { .. } => "--tools",
                }
                .to_string()
            });
        let (field, _) = c.to_field();
        Err(CmplError::invalid(
            field,
            format!("`{flag}` holds {} that cannot be enforced: {why}", c.kind()),
        ))
    }
}

/// The config's runtime keys, each parsed by its flag's own definition, so
/// a key accepts exactly what the flag does.
fn runtime_from_config(config: &Config) -> Result<Cli> {
    let mut args = vec!["cmpl".to_string()];
    for (key, value) in &config.runtime {
        let must = match (value, key.as_str()) {
            (Value::Bool(on), "deterministic") => {
                if *on {
                    args.push("--deterministic".to_string());
                }
                continue;
            }
            (_, "deterministic") => Err("true or false"),
            (Value::Number(n), _) => Ok(n.to_string()),
            (Value::String(s), "base_url") => Ok(s.clone()),
            (Value::Array(urls), "base_url") if urls.iter().all(Value::is_string) => {
                // A list: one engine each.
                for url in urls.iter().filter_map(Value::as_str) {
                    args.push(format!("--base-url={url}"));
                }
                continue;
            }
            (_, "base_url") => Err("a URL string, or a list of them"),
            (Value::String(s), "rpc") => Ok(s.clone()),
            (Value::Array(servers), "rpc") if servers.iter().all(Value::is_string) => {
                for server in servers.iter().filter_map(Value::as_str) {
                    args.push(format!("--rpc={server}"));
                }
                continue;
            }
            (_, "rpc") => Err("\"HOST:PORT\", or a list of them"),
            (Value::String(s), "keep_alive") => Ok(s.clone()),
            (_, "keep_alive") => Err("a duration like \"5m\", or seconds"),
            (Value::String(s), "compat") => Ok(s.clone()),
            (_, "compat") => Err("\"cmpl\" or \"openai\""),
            _ => Err("a whole number"),
        };
        let text =
            must.map_err(|what| config.bad_key(key, &format!("must be {what}, not {value}")))?;
        args.push(format!("--{}={text}", key.replace('_', "-")));
    }
    Cli::try_parse_from(&args).map_err(|e| config.bad_key(&clap_param(&e), &clap_message(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::{Field, Group, TABLE};

    fn flags(args: &[&str]) -> Result<RawRequest> {
        let cli = Cli::try_parse_from(std::iter::once("cmpl").chain(args.iter().copied()))
            .map_err(|e| CmplError::invalid(&clap_param(&e), clap_message(&e)))?;
        Ok(cli.resolve(&Config::default())?.flags)
    }

    #[test]
    fn request_flags_become_the_fields_a_json_request_would_have() {
        let raw = flags(&[
            "--max-tokens",
            "5",
            "--temperature",
            "0",
            "--stop",
            "a",
            "--stop",
            "b",
            "--logit-bias",
            "7=-2.5",
            "-n",
            "2",
            "--echo",
            "--regex",
            "[a-z]+",
            "hi",
        ])
        .unwrap();
        assert_eq!(raw.get("max_tokens"), Some(&json!(5)));
        assert_eq!(raw.get("temperature"), Some(&json!(0.0)));
        assert_eq!(raw.get("stop"), Some(&json!(["a", "b"])));
        assert_eq!(raw.get("logit_bias"), Some(&json!({"7": -2.5})));
        assert_eq!(raw.get("n"), Some(&json!(2)));
        assert_eq!(raw.get("echo"), Some(&json!(true)));
        assert_eq!(
            raw.get("structured_outputs"),
            Some(&json!({"regex": "[a-z]+"}))
        );
        // PROMPT is input, not a field.
        assert_eq!(raw.get("prompt"), None);
    }

    #[test]
    fn a_bad_flag_value_is_named_by_its_field() {
        let e = flags(&["--logit-bias", "7", "hi"]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        let e = flags(&["--top-p", "NaN", "hi"]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
        assert!(e.message.contains("finite"), "{}", e.message);
    }

    #[test]
    fn every_flag_the_table_names_is_a_flag_here_and_back() {
        use clap::CommandFactory;
        let command = Cli::command();
        let longs: Vec<&str> = command
            .get_arguments()
            .filter_map(|a| a.get_long())
            .collect();
        for field in TABLE {
            if let Some(flag) = field.flag {
                assert!(longs.contains(&flag), "--{flag} ({})", field.name);
            }
        }
        // Each flag under the Request and Chat headings is a field's.
        for arg in command.get_arguments() {
            let heading = arg.get_help_heading().unwrap_or("");
            if let (Some(long), "Request" | "Chat") = (arg.get_long(), heading) {
                // `--no-think` is `--think`'s other side.
                let is = |f: &&Field| {
                    f.flag == Some(long) || f.flag.is_some_and(|n| long == format!("no-{n}"))
                };
                let field = TABLE.iter().find(is);
                assert!(
                    field.is_some_and(|f| matches!(f.group, Group::Contract | Group::Chat)),
                    "--{long} has no field in the table"
                );
            }
        }
    }
}
