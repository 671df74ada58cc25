#!/usr/bin/env bash
# Start Ray on this box with the medgpt-ray placement conventions:
#   * one custom resource per physical GPU, `medgpt_gpu_<i>: 1`, i = nvidia-smi's index (PCI bus order);
#   * node labels `medgpt.io/gpu-count=<n>` and `medgpt.io/gpu-name=<model, e.g. rtx4090>`;
#   * CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA's device numbers are nvidia-smi's;
#   * token authentication on (RAY_AUTH_MODE=token), Prometheus metrics on port 8080,
#     the dashboard (head only) on loopback.
#
# Usage:
#   cluster/start-node.sh --head [--dry-run] [--cpu-only] [-- EXTRA RAY START ARGS]
#   cluster/start-node.sh --address=HEAD_IP:6379 [--dry-run] [--cpu-only] [-- EXTRA RAY START ARGS]
#
#   --dry-run    print the `ray start` command (one shell line on stdout) instead of running it
#   --cpu-only   do not look for GPUs: no medgpt_gpu_* resources, --num-gpus=0, gpu-count=0
#   -- ARGS      passed verbatim to `ray start` (the cluster launcher adds --autoscaling-config here)
#
# Environment:
#   MEDGPT_NVIDIA_SMI  the nvidia-smi executable to ask (default: nvidia-smi on PATH)
#   RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token  the cluster token (same on every node)
#
# Ray is taken from the project's .venv (next to this directory) when it exists, else from PATH.
set -euo pipefail

PROG=start-node.sh
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HEAD_PORT=6379
METRICS_PORT=8080
DASHBOARD_HOST=127.0.0.1

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

note() {
    echo "$PROG: $*" >&2
}

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
}

# Quote one word for a shell line; `--opt=value` keeps the option bare and quotes only the value.
shell_quote() {
    local word=$1 opt value
    if [[ $word =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
        printf '%s' "$word"
    elif [[ $word =~ ^(--[A-Za-z0-9-]+=)(.*)$ ]]; then
        opt=${BASH_REMATCH[1]}
        value=${BASH_REMATCH[2]}
        printf "%s'%s'" "$opt" "${value//\'/\'\\\'\'}"
    else
        printf "'%s'" "${word//\'/\'\\\'\'}"
    fi
}

# "NVIDIA GeForce RTX 4090" -> "rtx4090": lower case, vendor words dropped, only [a-z0-9] kept
# (a valid Ray/Kubernetes label value).
sanitize_gpu_name() {
    local s=${1,,}
    s=${s//nvidia/}
    s=${s//geforce/}
    s=${s//[^a-z0-9]/}
    s=${s:0:63}
    printf '%s' "${s:-unknown}"
}

trim() {
    local s=$1
    s=${s#"${s%%[![:space:]]*}"}
    s=${s%"${s##*[![:space:]]}"}
    printf '%s' "$s"
}

token_available() {
    if [[ -n ${RAY_AUTH_TOKEN:-} ]]; then
        return 0
    fi
    if [[ -n ${RAY_AUTH_TOKEN_PATH:-} ]]; then
        [[ -s $RAY_AUTH_TOKEN_PATH ]]
        return
    fi
    [[ -s $HOME/.ray/auth_token ]]
}

# ---- arguments -------------------------------------------------------------------------------
mode=""
address=""
dry_run=0
cpu_only=0
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --head) mode=head ;;
        --address=*) mode=worker; address=${1#--address=} ;;
        --address)
            [[ $# -ge 2 ]] || die "--address needs a value (HEAD_IP:6379)"
            mode=worker; address=$2; shift ;;
        --dry-run) dry_run=1 ;;
        --cpu-only) cpu_only=1 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown argument '$1' (see --help; pass extra ray start arguments after --)" ;;
    esac
    shift
done
[[ -n $mode ]] || die "give --head or --address=HEAD_IP:6379 (see --help)"
if [[ $mode == worker && -z $address ]]; then
    die "--address is empty (expected HEAD_IP:6379)"
fi

# ---- GPUs ----------------------------------------------------------------------------------------
gpu_count=0
gpu_name=none
resources=""
if [[ $cpu_only -eq 0 ]]; then
    if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then
        die "CUDA_VISIBLE_DEVICES is set ('$CUDA_VISIBLE_DEVICES'): this script advertises every GPU nvidia-smi" \
            "lists as medgpt_gpu_<i>; unset it before starting Ray"
    fi
    nvsmi=${MEDGPT_NVIDIA_SMI:-nvidia-smi}
    if ! command -v "$nvsmi" >/dev/null 2>&1; then
        die "no GPU found: '$nvsmi' is not an executable on this node (no NVIDIA driver?)." \
            "Install the driver, point MEDGPT_NVIDIA_SMI at nvidia-smi, or pass --cpu-only for a node without GPUs."
    fi
    if ! listing=$("$nvsmi" --query-gpu=index,name,pci.bus_id --format=csv,noheader 2>&1); then
        die "no GPU found: '$nvsmi --query-gpu=index,name,pci.bus_id --format=csv,noheader' failed: $listing"
    fi
    names=()
    entries=()
    while IFS= read -r line; do
        line=$(trim "$line")
        [[ -n $line ]] || continue
        [[ $line == *,*,* ]] || die "unexpected line from nvidia-smi: '$line'"
        idx=$(trim "${line%%,*}")
        bus=$(trim "${line##*,}")
        name=${line#*,}
        name=$(trim "${name%,*}")
        [[ $idx =~ ^[0-9]+$ ]] || die "unexpected GPU index from nvidia-smi: '$line'"
        if [[ $idx -ne ${#names[@]} ]]; then
            die "nvidia-smi listed GPU index $idx at position ${#names[@]}; expected indices 0..n-1 in order"
        fi
        names+=("$name")
        entries+=("\"medgpt_gpu_$idx\": 1")
        note "GPU $idx: $name ($bus)"
    done <<<"$listing"
    gpu_count=${#names[@]}
    if [[ $gpu_count -eq 0 ]]; then
        die "no GPU found: '$nvsmi' listed no GPU on this node. Check the driver (nvidia-smi -L)," \
            "or pass --cpu-only to start a node without GPUs."
    fi
    gpu_name=$(sanitize_gpu_name "${names[0]}")
    for name in "${names[@]}"; do
        if [[ $(sanitize_gpu_name "$name") != "$gpu_name" ]]; then
            note "warning: GPUs of different models on this node; labelling it medgpt.io/gpu-name=mixed"
            gpu_name=mixed
            break
        fi
    done
    joined=$(printf '%s, ' "${entries[@]}")
    resources="{${joined%, }}"
fi
labels="medgpt.io/gpu-count=$gpu_count,medgpt.io/gpu-name=$gpu_name"

# ---- ray -----------------------------------------------------------------------------------------
if [[ -x $REPO/.venv/bin/ray ]]; then
    ray_bin=$REPO/.venv/bin/ray
elif command -v ray >/dev/null 2>&1; then
    ray_bin=$(command -v ray)
elif [[ $dry_run -eq 1 ]]; then
    ray_bin=ray
else
    die "ray not found: neither $REPO/.venv/bin/ray nor ray on PATH (install the project first)"
fi

export CUDA_DEVICE_ORDER=PCI_BUS_ID
export RAY_AUTH_MODE=token

cmd=("$ray_bin" start)
if [[ $mode == head ]]; then
    cmd+=(--head "--port=$HEAD_PORT" "--dashboard-host=$DASHBOARD_HOST")
else
    cmd+=("--address=$address")
fi
cmd+=("--metrics-export-port=$METRICS_PORT" "--num-gpus=$gpu_count")
if [[ -n $resources ]]; then
    cmd+=("--resources=$resources")
fi
cmd+=("--labels=$labels")
if [[ ${#extra[@]} -gt 0 ]]; then
    cmd+=("${extra[@]}")
fi

# ---- token -----------------------------------------------------------------------------------------
if ! token_available; then
    if [[ $mode == head && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
        if [[ $dry_run -eq 1 ]]; then
            note "no token in ~/.ray/auth_token: would run '$ray_bin get-auth-token --generate' first"
        else
            note "no token in ~/.ray/auth_token: generating one; copy it to every other node (chmod 600)"
            mkdir -m 700 -p "$HOME/.ray"
            # Ray writes the token 0644: created under umask 077 it is never readable by others, not even briefly.
            (umask 077 && "$ray_bin" get-auth-token --generate >/dev/null)
            chmod 600 "$HOME/.ray/auth_token"
        fi
    elif [[ $dry_run -eq 1 ]]; then
        note "warning: no Ray auth token on this node (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"
    else
        die "no Ray auth token on this node: copy the head's ~/.ray/auth_token to ~/.ray/auth_token here" \
            "(chmod 600), or set RAY_AUTH_TOKEN_PATH / RAY_AUTH_TOKEN"
    fi
fi

# ---- the token file's mode: whoever reads it can join the cluster and run code on every node ----------
token_file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
if [[ -z ${RAY_AUTH_TOKEN:-} && -f $token_file ]]; then
    mode_bits=$(stat -c %a "$token_file")
    if (( 8#$mode_bits & 8#077 )); then
        if [[ $dry_run -eq 1 ]]; then
            note "warning: $token_file is mode $mode_bits (readable by others); would chmod 600 it"
        else
            note "$token_file was mode $mode_bits (readable by others): now 600"
            chmod 600 "$token_file"
        fi
    fi
    if [[ $token_file == "$HOME/.ray/auth_token" && $dry_run -eq 0 ]] && (( 8#$(stat -c %a "$HOME/.ray") & 8#077 )); then
        chmod 700 "$HOME/.ray"  # Ray creates it 0755; what it holds (the token, session files) is the owner's
    fi
fi

line="CUDA_DEVICE_ORDER=PCI_BUS_ID RAY_AUTH_MODE=token"
for word in "${cmd[@]}"; do
    line+=" $(shell_quote "$word")"
done
if [[ $dry_run -eq 1 ]]; then
    printf '%s\n' "$line"
    exit 0
fi
note "running: $line"
note "port $METRICS_PORT answers GET /metrics on every interface without a token (Ray has no bind address for" \
     "it): admit only your Prometheus host, e.g. 'sudo ufw allow from PROM_IP to any port $METRICS_PORT proto tcp" \
     "&& sudo ufw deny $METRICS_PORT/tcp' (docs/security.md)"
exec "${cmd[@]}"
