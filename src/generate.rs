//! `--generate KIND`: the man page and shell completions, made from the clap
//! definitions so every flag is documented from its one definition, and
//! the request fields' page, from their one table (`fields`). The
//! checked-in `man/`, `completions/` and docs/fields.md are this output.

use clap::Command;
use clap_complete::Shell;
use clap_mangen::roff::{bold, italic, roman, Roff};
use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Man,
    CompleteBash,
    CompleteZsh,
    CompleteFish,
    CompletePowershell,
    CompleteElvish,
    /// docs/fields.md.
    Fields,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Man,
        Kind::CompleteBash,
        Kind::CompleteZsh,
        Kind::CompleteFish,
        Kind::CompletePowershell,
        Kind::CompleteElvish,
        Kind::Fields,
    ];

    /// The name `--generate` takes.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Man => "man",
            Kind::CompleteBash => "complete-bash",
            Kind::CompleteZsh => "complete-zsh",
            Kind::CompleteFish => "complete-fish",
            Kind::CompletePowershell => "complete-powershell",
            Kind::CompleteElvish => "complete-elvish",
            Kind::Fields => "fields",
        }
    }

    pub fn from_name(name: &str) -> Kind {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .unwrap_or(Kind::Man)
    }

    /// Where the generated file lives in the source tree (the checked-in
    /// copies are tested against, and rewritten from, this list).
    pub fn path(self) -> &'static str {
        match self {
            Kind::Man => "man/cmpl.1",
            Kind::CompleteBash => "completions/cmpl.bash",
            Kind::CompleteZsh => "completions/_cmpl",
            Kind::CompleteFish => "completions/cmpl.fish",
            Kind::CompletePowershell => "completions/_cmpl.ps1",
            Kind::CompleteElvish => "completions/cmpl.elv",
            Kind::Fields => "docs/fields.md",
        }
    }
}

/// Writes `kind` for the command `cmd` (the CLI's clap definition).
pub fn generate(kind: Kind, mut cmd: Command, out: &mut dyn Write) -> std::io::Result<()> {
    let shell = match kind {
        Kind::Man => return man(cmd, out),
        Kind::Fields => return out.write_all(crate::fields::markdown().as_bytes()),
        Kind::CompleteBash => Shell::Bash,
        Kind::CompleteZsh => Shell::Zsh,
        Kind::CompleteFish => Shell::Fish,
        Kind::CompletePowershell => Shell::PowerShell,
        Kind::CompleteElvish => Shell::Elvish,
    };
    clap_complete::generate(shell, &mut cmd, "cmpl", out);
    Ok(())
}

/// Sections beyond the flags: how input is read, exit codes, environment,
/// files and examples.
const SECTIONS: &[(&str, &[&str])] = &[
    (
        "INPUT",
        &[
            "Standard input is read when it is not a terminal. Input that starts with '{' is a JSON \
             CompletionRequest: its fields are the request, flags given on the command line override them, PROMPT \
             replaces its prompt, and the answer is JSON (errors included). Anything else is text: the prompt is \
             that text, a newline, then PROMPT (cat notes.txt | cmpl 'Summarize the notes above:'), or the text \
             alone without PROMPT. With standard input a terminal, PROMPT is the prompt. --request FILE forces the \
             JSON reading, --prompt-file FILE the text reading ('-' for standard input). In a shell loop that reads \
             standard input itself (while read ...), give cmpl </dev/null so it does not read the loop's input.",
            "Every field of the request is also a flag: the field name in kebab case (max_tokens is --max-tokens). \
             Unknown fields, wrong types and out-of-range values are errors, never silently ignored or clamped.",
            "Defaults come, lowest first, from built-in values, the config file, the JSON request, and flags.",
        ],
    ),
    (
        "OUTPUT",
        &[
            "Text mode prints the completion and nothing else on standard output; on a terminal tokens appear \
             as they are generated and a final newline is added. With -n above 1, each choice is printed under \
             a '--- choice I (seed S, REASON) ---' header on a terminal; piped, standard output holds only the \
             texts, a newline between two, and the headers go to standard error. --json prints one CompletionResponse object on one \
             line; --stream --json prints Server-Sent Events, one 'data: <CompletionChunk>' per token and a \
             final 'data: [DONE]'. --batch prints one JSON line per input line.",
            "With --logprobs on a terminal, text mode colours each generated token by its probability (a \
             legend goes to standard error); with --echo the prompt is dimmed.",
        ],
    ),
    (
        "EXIT STATUS",
        &[
            "0 success; 1 model or runtime error (missing or invalid model, context too small, I/O; a server \
             that cannot be reached, refuses the key, or fails); 2 invalid request (a flag, field or value, or \
             the config file; a request a server refuses with a 4xx); 130 interrupted by SIGINT. With --batch, 1 \
             when any line failed. A closed standard output (cmpl ... | head) ends the run quietly with 0.",
        ],
    ),
    (
        "ENVIRONMENT",
        &[
            "CMPL_MODEL: the local model when neither -m nor the request names one (before the config file's).",
            "CMPL_CONFIG: the config file to read instead of the default one.",
            "CMPL_BASE_URL: a server's API root to send requests to, as --base-url (the flag wins; the config's \
             base_url comes last).",
            "CMPL_API_KEY: the key sent to that server as 'Authorization: Bearer'. It is never taken on the \
             command line, printed or logged. Without it, TOGETHER_API_KEY is read for api.together.xyz and \
             OPENAI_API_KEY for api.openai.com, over https only, and for no other host; a --base-url with user \
             information (user@host) is refused, and CMPL_API_KEY over plain http to a host that is not \
             loopback is sent with a warning. With --serve, the key clients must send \
             (required to serve on an address other than loopback).",
            "CMPL_API_KEY_FILE: with --serve, a file whose first line is that key, when CMPL_API_KEY is unset.",
            "CMPL_KEEP_ALIVE: as --keep-alive, for every run on a local model (the flag wins, then the \
             config's keep_alive): 5m keeps the model loaded in a resident cmpl between calls.",
            "XDG_RUNTIME_DIR: where residents' sockets live (its cmpl folder; /tmp/cmpl-UID without it). A \
             folder or socket another user owns, or one open to others, is never used.",
            "NO_COLOR: when set and not empty, no colour (as --color never).",
            "SOURCE_DATE_EPOCH: with --batch, the 'created' time of every response, so that the same input \
             gives a byte-identical output file.",
        ],
    ),
    (
        "FILES",
        &[
            "~/.config/cmpl/config.json: defaults, one JSON object. Keys: any request field under its own name \
             (max_tokens, temperature, stop, ...) and model, threads, n_gpu_layers, rpc, ctx_size, parallel, \
             lookup, deterministic, base_url, connect_timeout, read_timeout, keep_alive (each taking what its flag takes). A bad key or value is an error naming the file and the key (exit 2).",
            "~/.cache/cmpl/models/ (~/Library/Caches/cmpl/models/ on macOS; cmpl --models-dir prints it): models \
             found by name (-m NAME finds NAME or NAME.gguf here), listed by --list-models; the default model is \
             gemma-3-270m-q4_k_m.gguf. (~/Library/Application Support/cmpl/ holds the config on macOS.)",
        ],
    ),
    (
        "EXAMPLES",
        &[
            "cmpl \"The capital of France is\" --max-tokens 16 --temperature 0",
            "echo '{\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"n\":2}' | cmpl",
            "cmpl --stream --json \"def fib(n):\" --stop $'\\n\\n'",
            "cmpl --json \"The sky is\" --max-tokens 4 --logprobs 3 --echo",
            "cmpl --batch requests.jsonl > answers.jsonl",
            "cmpl --base-url http://127.0.0.1:8080/v1 --stream \"Once upon a time\"",
            "cmpl --serve    (then point an SDK at http://127.0.0.1:8337/v1)",
            "cmpl --keep-alive 5m \"The capital of France is\"    (the next call finds the model loaded)",
            "cmpl --ps; cmpl --stop-resident all",
        ],
    ),
];

fn man(cmd: Command, out: &mut dyn Write) -> std::io::Result<()> {
    let cmd = cmd.version(env!("CARGO_PKG_VERSION"));
    let man = clap_mangen::Man::new(cmd)
        .date("")
        .source(format!("cmpl {}", env!("CARGO_PKG_VERSION")));
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    let mut roff = Roff::new();
    roff.control("SH", ["DESCRIPTION"]).text([roman(
        "cmpl is the /completions API as a command-line tool: it loads a GGUF model through llama.cpp and \
         completes a prompt, printing the text, the API's JSON response, or its stream of events.",
    )]);
    roff.to_writer(out)?;
    man.render_options_section(out)?;
    let mut roff = Roff::new();
    for (title, paragraphs) in SECTIONS {
        roff.control("SH", [*title]);
        for p in *paragraphs {
            let text = if *title == "EXAMPLES" {
                bold(*p)
            } else {
                roman(*p)
            };
            roff.control("PP", []).text([text]);
        }
    }
    roff.control("SH", ["SEE ALSO"]).text([
        italic("llama-completion"),
        roman("(1); the response schemas, as JSON Schema, are tests/schema/completions.schema.json in the cmpl source tree"),
    ]);
    roff.to_writer(out)?;
    man.render_version_section(out)
}
