PYTHONPATH=/tmp/site-tl:/tmp/site-fla:/tmp/site: python3 bench/greedy_equality.py --model qwen3.5-0.8b --work /tmp/hyb --out /tmp/hyb/greedy_equality.json
