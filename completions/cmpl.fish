complete -c cmpl -s m -l model -d 'GGUF model file, the name of one in the models folder, or a Hugging Face model hf.co/ORG/REPO[:QUANT] (downloaded once into the hub cache) [default: $CMPL_MODEL, the config\'s model, then gemma-3-270m-q4_k_m.gguf in the cache dir]. With --serve, given again: several models behind one address, each answering to its file\'s stem, or to NAME as -m NAME=PATH' -r
complete -c cmpl -l max-tokens -d 'Tokens to generate per choice, 1.. [default: 128]' -r
complete -c cmpl -l stop -d 'Stop when the text contains this string (not included); repeatable' -r
complete -c cmpl -l temperature -d 'Sampling temperature, 0..2; 0 is greedy and deterministic [default: 0.7]' -r
complete -c cmpl -l top-p -d 'Nucleus sampling: keep the most likely tokens up to this total probability, 0..1 [default: 1, off]' -r
complete -c cmpl -l top-k -d 'Keep only the K most likely tokens, 0.. [default: 0, off]' -r
complete -c cmpl -l repetition-penalty -d 'Divide the logits of tokens already seen, 0..10 exclusive of 0 [default: 1, off]' -r
complete -c cmpl -l stream -d 'Print tokens as they are generated (Server-Sent Events with --json)' -r -f -a "true\t''
false\t''"
complete -c cmpl -l logprobs -d 'Return each token\'s log-probability and the K most likely alternatives, 0..20' -r
complete -c cmpl -l echo -d 'Return the prompt too (with its logprobs when --logprobs is set)' -r -f -a "true\t''
false\t''"
complete -c cmpl -s n -l n -d 'Number of choices to generate for the prompt, 1..128 [default: 1]' -r
complete -c cmpl -l safety-model -d 'A guard model (Llama Guard, ShieldGemma; any model reference) that must find the prompt, then the answer, safe: a flagged one is never shown (exit 3, the categories named). Streams wait for its verdict' -r
complete -c cmpl -l min-p -d 'Drop tokens less likely than P times the most likely one, 0..1 [default: 0, off]' -r
complete -c cmpl -l presence-penalty -d 'Penalize tokens that have appeared at all, -2..2 [default: 0]' -r
complete -c cmpl -l frequency-penalty -d 'Penalize tokens by how often they have appeared, -2..2 [default: 0]' -r
complete -c cmpl -l logit-bias -d 'Add BIAS (-100..100) to token ID\'s logit; repeatable' -r
complete -c cmpl -l seed -d 'Seed for sampling, 0..4294967295; choice i uses SEED+i [default: random, reported]' -r
complete -c cmpl -l json-schema -d 'The text is JSON that follows this JSON Schema (the request\'s response_format json_schema)' -r
complete -c cmpl -l json-schema-file -d 'The text is JSON that follows the JSON Schema in FILE' -r -F
complete -c cmpl -l regex -d 'The whole text matches this regex (Rust regex syntax; structured_outputs regex)' -r
complete -c cmpl -l choice -d 'The text is exactly one of these; repeatable (structured_outputs choice)' -r
complete -c cmpl -l grammar -d 'The text is in the language of this GBNF grammar\'s root rule (llama.cpp\'s grammar format; structured_outputs grammar)' -r
complete -c cmpl -l grammar-file -d 'The text follows the GBNF grammar in FILE' -r -F
complete -c cmpl -l chat -d 'Instruct models: the prompt becomes one user message, rendered through the model\'s own chat template (tokenizer.chat_template) with the assistant\'s turn opened; the answer ends at the turn\'s end. Also $CMPL_CHAT=1 or the config\'s "chat" [default: off, raw prompts]' -r -f -a "true\t''
false\t''"
complete -c cmpl -l system -d 'A system message before the prompt (implies --chat)' -r
complete -c cmpl -l chat-template -d 'The Jinja chat template in FILE instead of the model\'s own, for a model without one (implies --chat)' -r -F
complete -c cmpl -l tools -d 'Functions the answer may call: a JSON list of {"type": "function", "function": {"name", "description", "parameters"}} in FILE, shown to the model by its template (implies --chat). A call is constrained to the model\'s format and the tool\'s schema (docs/chat.md)' -r -F
complete -c cmpl -l tool-choice -d 'With --tools: auto (the model chooses), none, required (at least one call), or a tool\'s name (a call of it) [default: auto]' -r
complete -c cmpl -l parallel-tool-calls -d 'With --tools: more than one call in an answer [default: true]' -r -f -a "true\t''
false\t''"
complete -c cmpl -l reasoning-budget -d 'At most N thinking tokens: then the reasoning\'s close is forced and the answer begins, as llama.cpp\'s --reasoning-budget (implies --chat)' -r
complete -c cmpl -l request -d 'Read the JSON request from FILE (\'-\' for stdin)' -r -F
complete -c cmpl -l prompt-file -d 'Read the prompt as plain text from FILE (\'-\' for stdin)' -r -F
complete -c cmpl -l tokenize -d 'Print the ids TEXT tokenizes to, as the model reads a prompt (its BOS included where it adds one), space-separated; with --json, {"tokens": [...], "count": N}. "-" reads TEXT from stdin' -r
complete -c cmpl -l batch -d 'Answer a JSON Lines file of requests (stdin without FILE), one JSON line out per line in, in order, decoding the requests together. Exit 1 if any line failed. Lines with "stream": true get a whole response' -r -F
complete -c cmpl -l output -d 'Write --batch\'s answers to FILE instead of stdout, each as it completes (in input order; those ahead of their turn wait in FILE.pending). A rerun with the same input and FILE answers only what is missing' -r -F
complete -c cmpl -l parallel -d 'Sequences decoded together in --batch mode, and --serve\'s slots [default: 32, fewer if their KV cache would take over half the memory]' -r
complete -c cmpl -s t -l threads -d 'CPU threads, 1..1024 [default: physical cores]' -r
complete -c cmpl -s c -l ctx-size -d 'KV cache size in tokens, shared by all choices; with --serve, split evenly among the --parallel slots [default: sized to the request; 4096 per slot]' -r
complete -c cmpl -l n-gpu-layers -d 'Layers to offload to the GPU (also -ngl) [default: all, when built with a GPU backend]' -r
complete -c cmpl -l rpc -d 'Spread the model\'s layers over llama.cpp `ggml-rpc-server`s at HOST:PORT (comma-separated, or the flag again), as llama.cpp\'s --rpc. The protocol has no authentication: a host other than loopback is used with a warning (docs/remote.md)' -r
complete -c cmpl -l lookup -d 'Prompt lookup: draft up to N tokens per step from the prompt and the text so far (where the answer copies them: code edits, quotes, extraction), or the text a constraint forces next, verified in the same decode call; the text is the model\'s, as without it, up to rounding at near-ties. 0 turns it off [default: 15]' -r
complete -c cmpl -l serve -d 'Serve the completions API over HTTP at ADDR (host:port, a port on 127.0.0.1, or unix:PATH for a socket only this user can reach) [default: 127.0.0.1:8337]; another address needs CMPL_API_KEY' -r
complete -c cmpl -l keep-alive -d 'Keep the model loaded between calls: a run on a local model uses (or starts) a resident cmpl holding the same model file with the same settings, which leaves after DURATION without a request (30s, 5m, 1h; 0 off; a bare number is seconds); with --serve, the server leaves after DURATION idle [default: $CMPL_KEEP_ALIVE, the config\'s keep_alive, else off; without a value: 5m]' -r
complete -c cmpl -l stop-resident -d 'End the residents holding MODEL (as -m names it), or all of them, once their requests in flight are answered [default: all]' -r
complete -c cmpl -l drain-timeout -d 'With --serve: on SIGINT/SIGTERM, seconds the requests in flight may take to finish before they are cancelled, 0..86400 [default: 300]' -r
complete -c cmpl -l queue-memory -d 'With --serve: memory the requests waiting for a slot may hold, in bytes (or with K, M or G); a request past it is answered 503 with Retry-After [default: an eighth of the memory free at start]' -r
complete -c cmpl -l queue-timeout -d 'With --serve: seconds a request may wait for a slot before it is answered 503 with Retry-After, 1..86400 [default: 600, the OpenAI SDK\'s own timeout]' -r
complete -c cmpl -l models-max -d 'With --serve of several models: how many may be loaded at once (the least recently used idle one leaves for another) [default: as many as the memory budget holds]' -r
complete -c cmpl -l models-memory -d 'With --serve of several models: the memory the loaded models may hold together (weights and KV cache), in bytes or with K, M or G [default: three quarters of the memory free at start]' -r
complete -c cmpl -l models-idle -d 'With --serve of several models: a model without a request for DURATION is unloaded (30s, 5m, 1h) [default: never; --keep-alive still ends the whole server]' -r
complete -c cmpl -l pin -d 'With --serve of several models: load NAME at start and keep it loaded (given again, several)' -r
complete -c cmpl -l base-url -d 'Send requests to a server\'s completions API at this root (http://127.0.0.1:8080/v1) instead of running a local model; given again, several engines share the requests [default: $CMPL_BASE_URL]' -r
complete -c cmpl -l connect-timeout -d 'Seconds to wait for a connection to the server, 1..3600 [default: 10]' -r
complete -c cmpl -l read-timeout -d 'Seconds the server may stay silent once asked, 1..86400 [default: 600]' -r
complete -c cmpl -l color -d 'When to colour output' -r -f -a "auto\t''
always\t''
never\t''"
complete -c cmpl -l reasoning -d 'Text mode: where a thinking model\'s reasoning goes. auto: to stderr, dimmed, when stderr is a terminal (a person watching sees it think), else nowhere (logs stay the answers\'); show: to stderr always; hide: nowhere. Stdout holds the answer alone either way' -r -f -a "auto\t''
show\t''
hide\t''"
complete -c cmpl -l compat -d 'Whose shape an answer takes where the contract and OpenAI\'s completions differ. cmpl: the contract\'s (an echoed prompt in the response\'s prompt[]); openai: OpenAI\'s (the echoed prompt at the head of each choice\'s text and logprobs, as evaluation harnesses read it). For --json, --batch and --serve' -r -f -a "cmpl\t''
openai\t''"
complete -c cmpl -l models-dir -d 'Print the models folder: where -m NAME looks, and where the default model goes. With --serve and DIR: serve every GGUF in DIR, each by its file\'s stem' -r -F
complete -c cmpl -l generate -d 'Print the man page or a shell completion script' -r -f -a "man\t''
complete-bash\t''
complete-zsh\t''
complete-fish\t''
complete-powershell\t''
complete-elvish\t''
fields\t''"
complete -c cmpl -l json-object -d 'The text is a JSON object (response_format json_object)'
complete -c cmpl -l think -d 'A thinking model reasons before it answers: the template\'s enable_thinking (unset, each template keeps its own default; implies --chat). The reasoning is kept apart from the answer (--reasoning; reasoning_content in JSON)'
complete -c cmpl -l no-think -d 'A thinking model answers without reasoning (enable_thinking false, or its reasoning closed at once; implies --chat)'
complete -c cmpl -l json -d 'Print the API\'s JSON: one CompletionResponse, or SSE chunks with --stream'
complete -c cmpl -l no-prefix-cache -d 'Evaluate every prompt from its first token, instead of starting from the KV cells of an earlier prompt that began the same way (batch lines, server requests; kept while memory allows)'
complete -c cmpl -l deterministic -d 'Deterministic mode: a seeded request gives the same bytes (text, logprobs, finish reasons) alone, in any --batch mix, at any --parallel, or on a loaded server, on the same build, CPU and --threads; for some speed (weights not repacked, a ballast sequence beside one decoding alone)'
complete -c cmpl -l no-repack -d 'Keep the weights as stored instead of repacking some into CPU-friendly layouts at load (as llama.cpp\'s --no-repack): less memory and a faster load, slower prompts and batches'
complete -c cmpl -l verbose -d 'Show llama.cpp\'s own log, and how long the model took to load, on stderr'
complete -c cmpl -l ps -d 'List the resident models this user runs (model, pid, memory, idle time, time left, requests served, settings)'
complete -c cmpl -l strict-model -d 'With --serve: answer a request naming another model with 404 (default: the served model answers it)'
complete -c cmpl -l trust-request-templates -d 'With --serve: take a chat template in a request body (`chat_template`). A template is a program the server runs, so by default only the model\'s own and --chat-template\'s are used, and a request that sends one is refused (400)'
complete -c cmpl -l list-models -d 'List the models in the models folder and the hub cache with size, architecture and parameters'
complete -c cmpl -s V -l version -d 'Print the version and the GPU backends compiled in'
complete -c cmpl -s h -l help -d 'Print help'
