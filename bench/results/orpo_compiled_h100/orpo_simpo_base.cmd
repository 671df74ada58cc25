bash -c cd .base && exec python3 "benchnow/$0" "$@" real_length_throughput.py --model qwen2.5-1.5b --stages orpo --steps 16 --warmup 4 --workdir /tmp/rlt_base --out /tmp/calls/orpo_simpo_base
