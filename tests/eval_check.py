"""tests/evaluate.rs: EleutherAI's lm-evaluation-harness, unchanged, scores
tiny local tasks through `cmpl --serve`, and every score is checked against
the same tokens' logprobs read from the command line (`cmpl --batch`).

usage: eval_check.py MODE BASE CMPL MODEL DATA WORK
  MODE  completions: local-completions (loglikelihood, multiple choice and
        generation, its tokenizer found on the server) and the gguf model
        (multiple choice by text offsets); chat: local-chat-completions
  BASE  the server, http://127.0.0.1:PORT
  CMPL  the cmpl binary; MODEL its model file
  DATA  tests/data/eval; WORK a scratch folder
Prints one line per check; exits non-zero at the first mismatch.
"""

import json
import os
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

MODE, BASE, CMPL, MODEL, DATA, WORK = sys.argv[1:7]
# Summed logprobs agree within rounding: the server may split a prompt
# into other batches than the command line does.
TOLERANCE = 2e-3

TASKS = {
    "cmpl_mc": """
task: cmpl_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
""",
    "cmpl_ll": """
task: cmpl_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gen.jsonl
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{question}}}}"
doc_to_target: " {{{{answer}}}}"
metric_list:
  - metric: perplexity
  - metric: acc
""",
    "cmpl_gen": """
task: cmpl_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: " {{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""",
}


def fail(message):
    print(f"MISMATCH: {message}", flush=True)
    sys.exit(1)


def write_tasks():
    folder = os.path.join(WORK, "tasks")
    os.makedirs(folder, exist_ok=True)
    for name, text in TASKS.items():
        with open(os.path.join(folder, f"{name}.yaml"), "w") as f:
            f.write(text.format(data=os.path.abspath(DATA)))
    return TaskManager(include_path=folder)


def evaluate(model, model_args, tasks, **kwargs):
    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=TASK_MANAGER,
        log_samples=True,
        batch_size=1,
        **kwargs,
    )
    return out["results"], out["samples"]


def batch(lines, *flags):
    """One `cmpl --batch` run: the response to each line, in order."""
    text = "".join(json.dumps(line) + "\n" for line in lines)
    run = subprocess.run(
        [CMPL, "-m", MODEL, "--batch", *flags],
        input=text,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        fail(f"cmpl --batch exited {run.returncode}: {run.stderr[-2000:]}")
    return [json.loads(line) for line in run.stdout.splitlines()]


def tokenized(texts):
    """Each text's ids as the harness's remote tokenizer has them (no BOS),
    read from the command line's echoed prompt."""
    answers = batch(
        [{"prompt": t, "echo": True, "max_tokens": 0, "logprobs": 0} for t in texts]
    )
    # "x" is one token: a second before it is the BOS the model adds.
    probe = batch([{"prompt": "x", "echo": True, "max_tokens": 0, "logprobs": 0}])[0]
    probe = probe["prompt"][0]["logprobs"]["token_ids"]
    bos = probe[0] if len(probe) > 1 else None
    ids = []
    for a in answers:
        got = a["prompt"][0]["logprobs"]["token_ids"]
        ids.append(got[1:] if got and got[0] == bos else got)
    return ids


def encode_pair(context, continuation, encode):
    """lm-eval's own split: the context's trailing spaces go with the
    continuation, and the continuation is what the whole adds."""
    n = len(context) - len(context.rstrip())
    if n:
        continuation = context[-n:] + continuation
        context = context[:-n]
    whole = encode[context + continuation]
    ctx = encode[context]
    return ctx, whole[len(ctx):]


def pairs_of(samples):
    out = []
    for s in samples:
        for args in s["arguments"]:
            out.append((args[0], args[1]) if isinstance(args, (list, tuple)) else
                       (args["arg_0"], args["arg_1"]))
    return out


def scores_of(samples):
    out = []
    for s in samples:
        for resp in s["resps"]:
            r = resp[0]
            out.append((float(r[0]), bool(r[1])))
    return out


def check_loglikelihoods(name, samples):
    pairs = pairs_of(samples)
    texts = sorted({t for c, x in pairs for t in (c.rstrip(), c + x)})
    encode = dict(zip(texts, tokenized(texts)))
    lines, ctxlens = [], []
    for context, continuation in pairs:
        ctx, cont = encode_pair(context, continuation, encode)
        lines.append({"prompt": ctx + cont, "echo": True, "max_tokens": 0, "logprobs": 1})
        ctxlens.append(len(ctx))
    answers = batch(lines)
    got = scores_of(samples)
    if len(got) != len(answers):
        fail(f"{name}: {len(got)} scores for {len(answers)} requests")
    for (score, greedy), answer, ctxlen, pair in zip(got, answers, ctxlens, pairs):
        part = answer["prompt"][0]["logprobs"]
        logprobs = part["token_logprobs"][ctxlen:]
        want = sum(logprobs)
        want_greedy = all(
            abs(lp - max(top.values())) < 1e-6
            for lp, top in zip(logprobs, part["top_logprobs"][ctxlen:])
        )
        if abs(score - want) > TOLERANCE * max(1, len(logprobs)):
            fail(f"{name} {pair!r}: the harness scored {score}, the CLI's logprobs sum to {want}")
        if greedy != want_greedy:
            fail(f"{name} {pair!r}: is_greedy {greedy}, the CLI's top tokens say {want_greedy}")
    print(f"ok {name}: {len(got)} loglikelihoods equal the CLI's", flush=True)
    return [want for want in (sum(a["prompt"][0]["logprobs"]["token_logprobs"][c:]) for a, c in zip(answers, ctxlens))]


def check_accuracy(name, results, samples, scores):
    """The task's accuracy is the share of questions whose answer scores best."""
    at, right = 0, 0
    for s in samples:
        k = len(s["arguments"])
        best = max(range(k), key=lambda i: scores[at + i])
        right += best == s["target"]
        at += k
    want = right / len(samples)
    got = results[name]["acc,none"]
    if abs(got - want) > 1e-9:
        fail(f"{name}: accuracy {got}, the CLI's logprobs make it {want}")
    print(f"ok {name}: accuracy {got} as the CLI's logprobs rank the choices", flush=True)


def check_generations(name, samples, chat):
    if chat:
        lines = [
            {"messages": messages_of(s["arguments"][0][0]),
             "max_tokens": 8, "temperature": 0, "stop": ["\n", "."], "seed": 1234}
            for s in samples
        ]
        # A batch line with messages answers in the completions shape.
        texts = [a["choices"][0]["text"] for a in batch(lines)]
    else:
        contexts = [s["arguments"][0][0] for s in samples]
        encode = dict(zip(contexts, tokenized(contexts)))
        lines = [
            {"prompt": encode[c], "max_tokens": 8, "temperature": 0, "stop": ["\n", "."], "seed": 1234}
            for c in contexts
        ]
        texts = [a["choices"][0]["text"] for a in batch(lines)]
    for s, want in zip(samples, texts):
        got = s["resps"][0][0]
        if got != want:
            fail(f"{name}: the harness got {got!r}, the CLI answers {want!r}")
    print(f"ok {name}: {len(texts)} generations equal the CLI's", flush=True)


def messages_of(asked):
    """The conversation the chat model was asked: the harness keeps it as
    the JSON of its messages (in a `JsonChatStr`)."""
    asked = getattr(asked, "prompt", asked)
    if isinstance(asked, str):
        try:
            asked = json.loads(asked)
        except ValueError:
            return [{"role": "user", "content": asked}]
    return list(asked)


def gguf_scores(pairs):
    """The gguf model's reading of an OpenAI-shaped echo: the tokens from
    the first whose text offset reaches the context's end, from the CLI."""
    answers = batch(
        [{"prompt": c + x, "echo": True, "max_tokens": 0, "logprobs": 1} for c, x in pairs],
        "--compat", "openai",
    )
    out = []
    for (context, _), a in zip(pairs, answers):
        part = a["choices"][0]["logprobs"]
        idx = 0
        while part["text_offset"][idx] < len(context):
            idx += 1
        out.append(sum(part["token_logprobs"][idx:]))
    return out


TASK_MANAGER = write_tasks()

if MODE == "completions":
    url = f"{BASE}/v1/completions"
    results, samples = evaluate(
        "local-completions", f"base_url={url},model=cmpl", ["cmpl_mc", "cmpl_ll", "cmpl_gen"]
    )
    scores = check_loglikelihoods("cmpl_mc", samples["cmpl_mc"])
    check_accuracy("cmpl_mc", results, samples["cmpl_mc"], scores)
    check_loglikelihoods("cmpl_ll", samples["cmpl_ll"])
    check_generations("cmpl_gen", samples["cmpl_gen"], chat=False)
    # The gguf model (written for llama-server): text prompts, offsets.
    results, samples = evaluate("gguf", f"base_url={BASE}", ["cmpl_mc"])
    got = scores_of(samples["cmpl_mc"])
    want = gguf_scores(pairs_of(samples["cmpl_mc"]))
    for (score, _), w in zip(got, want):
        if abs(score - w) > TOLERANCE * 8:
            fail(f"gguf cmpl_mc: the harness scored {score}, the CLI's logprobs sum to {w}")
    check_accuracy("cmpl_mc", results, samples["cmpl_mc"], want)
    print(f"ok gguf cmpl_mc: {len(got)} loglikelihoods equal the CLI's", flush=True)
elif MODE == "chat":
    url = f"{BASE}/v1/chat/completions"
    results, samples = evaluate(
        "local-chat-completions", f"base_url={url},model=cmpl", ["cmpl_gen"],
        apply_chat_template=True,
    )
    check_generations("cmpl_gen", samples["cmpl_gen"], chat=True)
else:
    fail(f"unknown mode {MODE}")
print("all ok", flush=True)
