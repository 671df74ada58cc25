python3 bench/peers/ours.py --model-dir /tmp/g/qwen2.5-1.5b --data /tmp/ss/corpus/sft.jsonl --steps 2 --work /tmp/ss --out /tmp/calls/ours_startup_warm.json --profile-startup
