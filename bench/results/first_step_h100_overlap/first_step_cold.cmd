python3 bench/real_length_throughput.py --model qwen2.5-1.5b --stages sft --steps 3 --warmup 1 --sft-records 1000 --set stages.sft.compile=true --workdir /tmp/rlt --out /tmp/calls/first_step_cold
