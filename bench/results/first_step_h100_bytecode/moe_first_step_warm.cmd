python3 bench/real_length_throughput.py --model qwen3-moe-8l --stages sft --steps 3 --warmup 1 --sft-records 1000 --workdir /tmp/rlt_moe_first_step_warm --out /tmp/calls/moe_first_step_warm
