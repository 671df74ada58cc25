PYTHONPATH=/tmp/site: python3 bench/hybrid_sft.py --model qwen2.5-1.5b --packing auto --steps 12 --warmup 2 --work /tmp/hyb --out /tmp/hyb/sft_dense_1.5b_packed.json
