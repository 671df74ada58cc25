python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --teacher qwen2.5-7b --teacher-quantization 4bit --train-steps 0 --steps 20 --max-completion-length 128 --out /tmp/calls/opd_7b
