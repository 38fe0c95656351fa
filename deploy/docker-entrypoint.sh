#!/bin/sh
# Entrypoint of the qwen3-tts-grpc image (POSIX sh; runs under tini).
#
#   docker-entrypoint.sh python -m talker_service ARGS   # a model stage: ensure a checkpoint, exec
#   docker-entrypoint.sh talker ARGS                     # shortcut for the same (also decoder,
#                                                        #   speaker, aligner, gateway)
#   docker-entrypoint.sh init-model [DIR]                # only ensure the checkpoint (default
#                                                        #   $QWEN3TTS_MODEL), then exit 0
#   docker-entrypoint.sh init-aligner [DIR]              # the same for the aligner's checkpoint
#                                                        #   (default $QWEN3TTS_ALIGNER_MODEL)
#   docker-entrypoint.sh ANY OTHER COMMAND               # exec'd unchanged (qwen3-tts health, sh)
#
# Checkpoint: the model stages (talker, decoder, speaker, aligner) read the directory given by
# --model, else QWEN3TTS_<STAGE>_MODEL, else QWEN3TTS_MODEL (image defaults: /models/checkpoint,
# and /models/aligner for the aligner). If it has no config.json, a small RANDOM dev checkpoint
# (official layout; noise, not speech) is created there with `qwen3-tts make-dev-model DIR
# --if-missing` (the aligner's: a random Qwen3-ForcedAligner, qwen3_tts.dev_aligner), so the
# stack runs with no released model mounted. Production sets QWEN3TTS_DEV_MODEL=never: a missing checkpoint is then a startup error
# (exit 78) instead of a random model served silently.
#
# Environment: QWEN3TTS_DEV_MODEL=auto|never (default auto), QWEN3TTS_DEV_MODEL_TYPE=custom_voice|
# base|voice_design (default custom_voice).
set -eu

log() { printf 'docker-entrypoint: %s\n' "$*" >&2; }

case "${1:-}" in
    talker | decoder | speaker | aligner)
        stage=$1
        shift
        set -- python -m "${stage}_service" "$@"
        ;;
    gateway)
        shift
        set -- python -m gateway "$@"
        ;;
esac

# Which stage (if any) the command runs, and the checkpoint directory it will load.
init_only=false
init_kind=""
stage=""
model=""
previous=""
for arg in "$@"; do
    case "$arg" in
        init-model | init-aligner) [ "$previous" = "" ] && init_only=true && init_kind=$arg ;;
        talker_service | decoder_service | speaker_service | aligner_service)
            [ "$previous" = "-m" ] && stage=${arg%_service}
            ;;
        --model=*) model=${arg#--model=} ;;
    esac
    [ "$previous" = "--model" ] && model=$arg
    previous=$arg
done

# ensure_checkpoint DIR [aligner]: a checkpoint in DIR (the aligner's with `aligner`).
ensure_checkpoint() {
    dir=$1
    kind=${2:-tts}
    what=Qwen3-TTS
    [ "$kind" = aligner ] && what=Qwen3-ForcedAligner
    if [ -f "$dir/config.json" ]; then
        return 0
    fi
    case "${QWEN3TTS_DEV_MODEL:-auto}" in
        never | 0 | false | no | off)
            log "no checkpoint at $dir (config.json missing) and QWEN3TTS_DEV_MODEL=never:" \
                "mount a released $what checkpoint there (see deploy/OPERATIONS.md)"
            exit 78 # EX_CONFIG
            ;;
    esac
    if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
        log "no checkpoint at $dir and the directory is not writable (read-only mount?):" \
            "mount a released checkpoint there, or a writable volume for the dev checkpoint"
        exit 78
    fi
    if [ "$kind" = aligner ]; then
        log "WARNING: no aligner checkpoint at $dir: creating a small RANDOM dev aligner; its" \
            "timings are arbitrary. Mount a released Qwen3-ForcedAligner checkpoint at $dir."
        python -c 'import sys; from qwen3_tts.dev_aligner import make_dev_aligner; make_dev_aligner(sys.argv[1], if_missing=True)' "$dir"
        return 0
    fi
    log "WARNING: no checkpoint at $dir: creating a small RANDOM dev checkpoint" \
        "(${QWEN3TTS_DEV_MODEL_TYPE:-custom_voice}); it produces noise, not speech." \
        "Mount a released checkpoint at $dir for real audio."
    qwen3-tts make-dev-model "$dir" --if-missing --type "${QWEN3TTS_DEV_MODEL_TYPE:-custom_voice}"
}

if [ "$init_only" = true ]; then
    if [ "$init_kind" = init-aligner ]; then
        ensure_checkpoint "${2:-${QWEN3TTS_ALIGNER_MODEL:-/models/aligner}}" aligner
    else
        ensure_checkpoint "${2:-${QWEN3TTS_MODEL:-/models/checkpoint}}"
    fi
    exit 0
fi

if [ -n "$stage" ]; then
    if [ -z "$model" ]; then
        # Same precedence as the servers: QWEN3TTS_<STAGE>_MODEL > QWEN3TTS_MODEL.
        upper=$(printf '%s' "$stage" | tr '[:lower:]' '[:upper:]')
        eval "model=\${QWEN3TTS_${upper}_MODEL:-}"
        model=${model:-${QWEN3TTS_MODEL:-/models/checkpoint}}
    fi
    if [ "$stage" = aligner ]; then
        ensure_checkpoint "$model" aligner
    else
        ensure_checkpoint "$model"
    fi
fi

exec "$@"
