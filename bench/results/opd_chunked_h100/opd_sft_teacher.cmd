python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --train-steps 2 --steps 8 --max-completion-length 128 --out /tmp/calls/opd
