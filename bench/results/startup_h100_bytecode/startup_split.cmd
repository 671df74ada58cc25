python3 bench/startup_split.py --model /tmp/g/qwen2.5-1.5b --out /tmp/calls/startup_split.json
