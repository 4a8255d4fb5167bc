_cmpl() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="cmpl"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        cmpl)
            opts="-m -n -t -c -V -h --model --max-tokens --stop --temperature --top-p --top-k --repetition-penalty --stream --logprobs --echo --n --safety-model --min-p --presence-penalty --frequency-penalty --logit-bias --seed --json-schema --json-schema-file --json-object --regex --choice --grammar --grammar-file --chat --system --chat-template --tools --tool-choice --parallel-tool-calls --think --no-think --reasoning-budget --json --request --prompt-file --tokenize --batch --output --parallel --threads --ctx-size --n-gpu-layers --rpc --lookup --no-prefix-cache --deterministic --no-repack --verbose --serve --keep-alive --ps --stop-resident --strict-model --trust-request-templates --drain-timeout --queue-memory --queue-timeout --models-max --models-memory --models-idle --pin --base-url --connect-timeout --read-timeout --color --reasoning --compat --list-models --models-dir --generate --version --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -m)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stop)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --temperature)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --repetition-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stream)
                    COMPREPLY=($(compgen -W "true false" -- "${cur}"))
                    return 0
                    ;;
                --logprobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --echo)
                    COMPREPLY=($(compgen -W "true false" -- "${cur}"))
                    return 0
                    ;;
                --n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -n)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --safety-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --presence-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --frequency-penalty)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --logit-bias)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --json-schema)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --json-schema-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --regex)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --choice)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grammar)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grammar-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --chat)
                    COMPREPLY=($(compgen -W "true false" -- "${cur}"))
                    return 0
                    ;;
                --system)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --chat-template)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tools)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tool-choice)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --parallel-tool-calls)
                    COMPREPLY=($(compgen -W "true false" -- "${cur}"))
                    return 0
                    ;;
                --reasoning-budget)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --request)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tokenize)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --parallel)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --threads)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ctx-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -c)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --n-gpu-layers)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --rpc)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lookup)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --serve)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --keep-alive)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stop-resident)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --drain-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --queue-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --queue-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --models-max)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --models-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --models-idle)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pin)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --base-url)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --connect-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --read-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                --reasoning)
                    COMPREPLY=($(compgen -W "auto show hide" -- "${cur}"))
                    return 0
                    ;;
                --compat)
                    COMPREPLY=($(compgen -W "cmpl openai" -- "${cur}"))
                    return 0
                    ;;
                --models-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --generate)
                    COMPREPLY=($(compgen -W "man complete-bash complete-zsh complete-fish complete-powershell complete-elvish fields" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _cmpl -o nosort -o bashdefault -o default cmpl
else
    complete -F _cmpl -o bashdefault -o default cmpl
fi
