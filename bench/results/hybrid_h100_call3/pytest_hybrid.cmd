PYTHONPATH=/tmp/site-tl:/tmp/site-fla:/tmp/site: python3 -m pytest -q -p no:cacheprovider tests/stages/test_hybrid_packing.py -k trains_exactly or leaks or generation or installs or carry
