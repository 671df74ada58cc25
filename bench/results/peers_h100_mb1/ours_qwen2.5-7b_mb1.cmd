PYTHONPATH=/tmp/site python3 bench/peers/ours.py --model qwen2.5-7b --data /tmp/peers/corpus/sft.jsonl --work /tmp/peers --out /tmp/peers/ours_qwen2.5-7b_mb1.json --micro-batch 1
