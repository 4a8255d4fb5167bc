
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'cmpl' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'cmpl'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'cmpl' {
            [CompletionResult]::new('-m', '-m', [CompletionResultType]::ParameterName, 'GGUF model file, the name of one in the models folder, or a Hugging Face model hf.co/ORG/REPO[:QUANT] (downloaded once into the hub cache) [default: $CMPL_MODEL, the config''s model, then gemma-3-270m-q4_k_m.gguf in the cache dir]. With --serve, given again: several models behind one address, each answering to its file''s stem, or to NAME as -m NAME=PATH')
            [CompletionResult]::new('--model', '--model', [CompletionResultType]::ParameterName, 'GGUF model file, the name of one in the models folder, or a Hugging Face model hf.co/ORG/REPO[:QUANT] (downloaded once into the hub cache) [default: $CMPL_MODEL, the config''s model, then gemma-3-270m-q4_k_m.gguf in the cache dir]. With --serve, given again: several models behind one address, each answering to its file''s stem, or to NAME as -m NAME=PATH')
            [CompletionResult]::new('--max-tokens', '--max-tokens', [CompletionResultType]::ParameterName, 'Tokens to generate per choice, 1.. [default: 128]')
            [CompletionResult]::new('--stop', '--stop', [CompletionResultType]::ParameterName, 'Stop when the text contains this string (not included); repeatable')
            [CompletionResult]::new('--temperature', '--temperature', [CompletionResultType]::ParameterName, 'Sampling temperature, 0..2; 0 is greedy and deterministic [default: 0.7]')
            [CompletionResult]::new('--top-p', '--top-p', [CompletionResultType]::ParameterName, 'Nucleus sampling: keep the most likely tokens up to this total probability, 0..1 [default: 1, off]')
            [CompletionResult]::new('--top-k', '--top-k', [CompletionResultType]::ParameterName, 'Keep only the K most likely tokens, 0.. [default: 0, off]')
            [CompletionResult]::new('--repetition-penalty', '--repetition-penalty', [CompletionResultType]::ParameterName, 'Divide the logits of tokens already seen, 0..10 exclusive of 0 [default: 1, off]')
            [CompletionResult]::new('--stream', '--stream', [CompletionResultType]::ParameterName, 'Print tokens as they are generated (Server-Sent Events with --json)')
            [CompletionResult]::new('--logprobs', '--logprobs', [CompletionResultType]::ParameterName, 'Return each token''s log-probability and the K most likely alternatives, 0..20')
            [CompletionResult]::new('--echo', '--echo', [CompletionResultType]::ParameterName, 'Return the prompt too (with its logprobs when --logprobs is set)')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Number of choices to generate for the prompt, 1..128 [default: 1]')
            [CompletionResult]::new('--n', '--n', [CompletionResultType]::ParameterName, 'Number of choices to generate for the prompt, 1..128 [default: 1]')
            [CompletionResult]::new('--safety-model', '--safety-model', [CompletionResultType]::ParameterName, 'A guard model (Llama Guard, ShieldGemma; any model reference) that must find the prompt, then the answer, safe: a flagged one is never shown (exit 3, the categories named). Streams wait for its verdict')
            [CompletionResult]::new('--min-p', '--min-p', [CompletionResultType]::ParameterName, 'Drop tokens less likely than P times the most likely one, 0..1 [default: 0, off]')
            [CompletionResult]::new('--presence-penalty', '--presence-penalty', [CompletionResultType]::ParameterName, 'Penalize tokens that have appeared at all, -2..2 [default: 0]')
            [CompletionResult]::new('--frequency-penalty', '--frequency-penalty', [CompletionResultType]::ParameterName, 'Penalize tokens by how often they have appeared, -2..2 [default: 0]')
            [CompletionResult]::new('--logit-bias', '--logit-bias', [CompletionResultType]::ParameterName, 'Add BIAS (-100..100) to token ID''s logit; repeatable')
            [CompletionResult]::new('--seed', '--seed', [CompletionResultType]::ParameterName, 'Seed for sampling, 0..4294967295; choice i uses SEED+i [default: random, reported]')
            [CompletionResult]::new('--json-schema', '--json-schema', [CompletionResultType]::ParameterName, 'The text is JSON that follows this JSON Schema (the request''s response_format json_schema)')
            [CompletionResult]::new('--json-schema-file', '--json-schema-file', [CompletionResultType]::ParameterName, 'The text is JSON that follows the JSON Schema in FILE')
            [CompletionResult]::new('--regex', '--regex', [CompletionResultType]::ParameterName, 'The whole text matches this regex (Rust regex syntax; structured_outputs regex)')
            [CompletionResult]::new('--choice', '--choice', [CompletionResultType]::ParameterName, 'The text is exactly one of these; repeatable (structured_outputs choice)')
            [CompletionResult]::new('--grammar', '--grammar', [CompletionResultType]::ParameterName, 'The text is in the language of this GBNF grammar''s root rule (llama.cpp''s grammar format; structured_outputs grammar)')
            [CompletionResult]::new('--grammar-file', '--grammar-file', [CompletionResultType]::ParameterName, 'The text follows the GBNF grammar in FILE')
            [CompletionResult]::new('--chat', '--chat', [CompletionResultType]::ParameterName, 'Instruct models: the prompt becomes one user message, rendered through the model''s own chat template (tokenizer.chat_template) with the assistant''s turn opened; the answer ends at the turn''s end. Also $CMPL_CHAT=1 or the config''s "chat" [default: off, raw prompts]')
            [CompletionResult]::new('--system', '--system', [CompletionResultType]::ParameterName, 'A system message before the prompt (implies --chat)')
            [CompletionResult]::new('--chat-template', '--chat-template', [CompletionResultType]::ParameterName, 'The Jinja chat template in FILE instead of the model''s own, for a model without one (implies --chat)')
            [CompletionResult]::new('--tools', '--tools', [CompletionResultType]::ParameterName, 'Functions the answer may call: a JSON list of {"type": "function", "function": {"name", "description", "parameters"}} in FILE, shown to the model by its template (implies --chat). A call is constrained to the model''s format and the tool''s schema (docs/chat.md)')
            [CompletionResult]::new('--tool-choice', '--tool-choice', [CompletionResultType]::ParameterName, 'With --tools: auto (the model chooses), none, required (at least one call), or a tool''s name (a call of it) [default: auto]')
            [CompletionResult]::new('--parallel-tool-calls', '--parallel-tool-calls', [CompletionResultType]::ParameterName, 'With --tools: more than one call in an answer [default: true]')
            [CompletionResult]::new('--reasoning-budget', '--reasoning-budget', [CompletionResultType]::ParameterName, 'At most N thinking tokens: then the reasoning''s close is forced and the answer begins, as llama.cpp''s --reasoning-budget (implies --chat)')
            [CompletionResult]::new('--request', '--request', [CompletionResultType]::ParameterName, 'Read the JSON request from FILE (''-'' for stdin)')
            [CompletionResult]::new('--prompt-file', '--prompt-file', [CompletionResultType]::ParameterName, 'Read the prompt as plain text from FILE (''-'' for stdin)')
            [CompletionResult]::new('--tokenize', '--tokenize', [CompletionResultType]::ParameterName, 'Print the ids TEXT tokenizes to, as the model reads a prompt (its BOS included where it adds one), space-separated; with --json, {"tokens": [...], "count": N}. "-" reads TEXT from stdin')
            [CompletionResult]::new('--batch', '--batch', [CompletionResultType]::ParameterName, 'Answer a JSON Lines file of requests (stdin without FILE), one JSON line out per line in, in order, decoding the requests together. Exit 1 if any line failed. Lines with "stream": true get a whole response')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Write --batch''s answers to FILE instead of stdout, each as it completes (in input order; those ahead of their turn wait in FILE.pending). A rerun with the same input and FILE answers only what is missing')
            [CompletionResult]::new('--parallel', '--parallel', [CompletionResultType]::ParameterName, 'Sequences decoded together in --batch mode, and --serve''s slots [default: 32, fewer if their KV cache would take over half the memory]')
            [CompletionResult]::new('-t', '-t', [CompletionResultType]::ParameterName, 'CPU threads, 1..1024 [default: physical cores]')
            [CompletionResult]::new('--threads', '--threads', [CompletionResultType]::ParameterName, 'CPU threads, 1..1024 [default: physical cores]')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'KV cache size in tokens, shared by all choices; with --serve, split evenly among the --parallel slots [default: sized to the request; 4096 per slot]')
            [CompletionResult]::new('--ctx-size', '--ctx-size', [CompletionResultType]::ParameterName, 'KV cache size in tokens, shared by all choices; with --serve, split evenly among the --parallel slots [default: sized to the request; 4096 per slot]')
            [CompletionResult]::new('--n-gpu-layers', '--n-gpu-layers', [CompletionResultType]::ParameterName, 'Layers to offload to the GPU (also -ngl) [default: all, when built with a GPU backend]')
            [CompletionResult]::new('--rpc', '--rpc', [CompletionResultType]::ParameterName, 'Spread the model''s layers over llama.cpp `ggml-rpc-server`s at HOST:PORT (comma-separated, or the flag again), as llama.cpp''s --rpc. The protocol has no authentication: a host other than loopback is used with a warning (docs/remote.md)')
            [CompletionResult]::new('--lookup', '--lookup', [CompletionResultType]::ParameterName, 'Prompt lookup: draft up to N tokens per step from the prompt and the text so far (where the answer copies them: code edits, quotes, extraction), or the text a constraint forces next, verified in the same decode call; the text is the model''s, as without it, up to rounding at near-ties. 0 turns it off [default: 15]')
            [CompletionResult]::new('--serve', '--serve', [CompletionResultType]::ParameterName, 'Serve the completions API over HTTP at ADDR (host:port, a port on 127.0.0.1, or unix:PATH for a socket only this user can reach) [default: 127.0.0.1:8337]; another address needs CMPL_API_KEY')
            [CompletionResult]::new('--keep-alive', '--keep-alive', [CompletionResultType]::ParameterName, 'Keep the model loaded between calls: a run on a local model uses (or starts) a resident cmpl holding the same model file with the same settings, which leaves after DURATION without a request (30s, 5m, 1h; 0 off; a bare number is seconds); with --serve, the server leaves after DURATION idle [default: $CMPL_KEEP_ALIVE, the config''s keep_alive, else off; without a value: 5m]')
            [CompletionResult]::new('--stop-resident', '--stop-resident', [CompletionResultType]::ParameterName, 'End the residents holding MODEL (as -m names it), or all of them, once their requests in flight are answered [default: all]')
            [CompletionResult]::new('--drain-timeout', '--drain-timeout', [CompletionResultType]::ParameterName, 'With --serve: on SIGINT/SIGTERM, seconds the requests in flight may take to finish before they are cancelled, 0..86400 [default: 300]')
            [CompletionResult]::new('--queue-memory', '--queue-memory', [CompletionResultType]::ParameterName, 'With --serve: memory the requests waiting for a slot may hold, in bytes (or with K, M or G); a request past it is answered 503 with Retry-After [default: an eighth of the memory free at start]')
            [CompletionResult]::new('--queue-timeout', '--queue-timeout', [CompletionResultType]::ParameterName, 'With --serve: seconds a request may wait for a slot before it is answered 503 with Retry-After, 1..86400 [default: 600, the OpenAI SDK''s own timeout]')
            [CompletionResult]::new('--models-max', '--models-max', [CompletionResultType]::ParameterName, 'With --serve of several models: how many may be loaded at once (the least recently used idle one leaves for another) [default: as many as the memory budget holds]')
            [CompletionResult]::new('--models-memory', '--models-memory', [CompletionResultType]::ParameterName, 'With --serve of several models: the memory the loaded models may hold together (weights and KV cache), in bytes or with K, M or G [default: three quarters of the memory free at start]')
            [CompletionResult]::new('--models-idle', '--models-idle', [CompletionResultType]::ParameterName, 'With --serve of several models: a model without a request for DURATION is unloaded (30s, 5m, 1h) [default: never; --keep-alive still ends the whole server]')
            [CompletionResult]::new('--pin', '--pin', [CompletionResultType]::ParameterName, 'With --serve of several models: load NAME at start and keep it loaded (given again, several)')
            [CompletionResult]::new('--base-url', '--base-url', [CompletionResultType]::ParameterName, 'Send requests to a server''s completions API at this root (http://127.0.0.1:8080/v1) instead of running a local model; given again, several engines share the requests [default: $CMPL_BASE_URL]')
            [CompletionResult]::new('--connect-timeout', '--connect-timeout', [CompletionResultType]::ParameterName, 'Seconds to wait for a connection to the server, 1..3600 [default: 10]')
            [CompletionResult]::new('--read-timeout', '--read-timeout', [CompletionResultType]::ParameterName, 'Seconds the server may stay silent once asked, 1..86400 [default: 600]')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour output')
            [CompletionResult]::new('--reasoning', '--reasoning', [CompletionResultType]::ParameterName, 'Text mode: where a thinking model''s reasoning goes. auto: to stderr, dimmed, when stderr is a terminal (a person watching sees it think), else nowhere (logs stay the answers''); show: to stderr always; hide: nowhere. Stdout holds the answer alone either way')
            [CompletionResult]::new('--compat', '--compat', [CompletionResultType]::ParameterName, 'Whose shape an answer takes where the contract and OpenAI''s completions differ. cmpl: the contract''s (an echoed prompt in the response''s prompt[]); openai: OpenAI''s (the echoed prompt at the head of each choice''s text and logprobs, as evaluation harnesses read it). For --json, --batch and --serve')
            [CompletionResult]::new('--models-dir', '--models-dir', [CompletionResultType]::ParameterName, 'Print the models folder: where -m NAME looks, and where the default model goes. With --serve and DIR: serve every GGUF in DIR, each by its file''s stem')
            [CompletionResult]::new('--generate', '--generate', [CompletionResultType]::ParameterName, 'Print the man page or a shell completion script')
            [CompletionResult]::new('--json-object', '--json-object', [CompletionResultType]::ParameterName, 'The text is a JSON object (response_format json_object)')
            [CompletionResult]::new('--think', '--think', [CompletionResultType]::ParameterName, 'A thinking model reasons before it answers: the template''s enable_thinking (unset, each template keeps its own default; implies --chat). The reasoning is kept apart from the answer (--reasoning; reasoning_content in JSON)')
            [CompletionResult]::new('--no-think', '--no-think', [CompletionResultType]::ParameterName, 'A thinking model answers without reasoning (enable_thinking false, or its reasoning closed at once; implies --chat)')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print the API''s JSON: one CompletionResponse, or SSE chunks with --stream')
            [CompletionResult]::new('--no-prefix-cache', '--no-prefix-cache', [CompletionResultType]::ParameterName, 'Evaluate every prompt from its first token, instead of starting from the KV cells of an earlier prompt that began the same way (batch lines, server requests; kept while memory allows)')
            [CompletionResult]::new('--deterministic', '--deterministic', [CompletionResultType]::ParameterName, 'Deterministic mode: a seeded request gives the same bytes (text, logprobs, finish reasons) alone, in any --batch mix, at any --parallel, or on a loaded server, on the same build, CPU and --threads; for some speed (weights not repacked, a ballast sequence beside one decoding alone)')
            [CompletionResult]::new('--no-repack', '--no-repack', [CompletionResultType]::ParameterName, 'Keep the weights as stored instead of repacking some into CPU-friendly layouts at load (as llama.cpp''s --no-repack): less memory and a faster load, slower prompts and batches')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Show llama.cpp''s own log, and how long the model took to load, on stderr')
            [CompletionResult]::new('--ps', '--ps', [CompletionResultType]::ParameterName, 'List the resident models this user runs (model, pid, memory, idle time, time left, requests served, settings)')
            [CompletionResult]::new('--strict-model', '--strict-model', [CompletionResultType]::ParameterName, 'With --serve: answer a request naming another model with 404 (default: the served model answers it)')
            [CompletionResult]::new('--trust-request-templates', '--trust-request-templates', [CompletionResultType]::ParameterName, 'With --serve: take a chat template in a request body (`chat_template`). A template is a program the server runs, so by default only the model''s own and --chat-template''s are used, and a request that sends one is refused (400)')
            [CompletionResult]::new('--list-models', '--list-models', [CompletionResultType]::ParameterName, 'List the models in the models folder and the hub cache with size, architecture and parameters')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print the version and the GPU backends compiled in')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print the version and the GPU backends compiled in')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
