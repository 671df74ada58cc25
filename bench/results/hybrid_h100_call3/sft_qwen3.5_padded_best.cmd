PYTHONPATH=/tmp/site-tl:/tmp/site-fla:/tmp/site: python3 bench/hybrid_sft.py --model qwen3.5-0.8b --packing false --steps 12 --warmup 2 --work /tmp/hyb --out /tmp/hyb/sft_qwen3.5_padded_best.json
