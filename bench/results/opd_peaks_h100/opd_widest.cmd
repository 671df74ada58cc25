python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --train-steps 2 --steps 6 --max-completion-length 128 --widest-prompts 64 --workdir /tmp/rsr_widest --out /tmp/calls/opd_widest
