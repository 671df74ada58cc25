PYTHONPATH=/tmp/site-tl:/tmp/site-fla:/tmp/site: python3 bench/hybrid_kernels.py --out /tmp/hyb/hybrid_kernels_tilelang.json
