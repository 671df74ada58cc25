python3 bench/real_length_throughput.py --model qwen2.5-1.5b --stages orpo --steps 16 --warmup 4 --workdir /tmp/rlt --out /tmp/calls/orpo_simpo
