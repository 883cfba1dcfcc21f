"""Product-QA evidence ranking with the hybrid model (paper 002).

| module | holds |
|---|---|
| `config` | `PQAConfig` (the experiment YAML, `configs/pqa_synthetic.yaml`), `load_pqa_config`, `REPRESENTATIONS` |
| `data` | `group_questions`, `qrels_of`, `PQASampler`: evidence records as training / evaluation inputs |
| `train` | `pqa_model`, `build_pqa_model`, `representation_loss` (Eq. 5's terms), `train_pqa` |
| `scoring` | `SplitScores`, `score_split`: dense, sparse and BM25 scores of every candidate of a split |
| `evaluation` | dev tuning of lambda / normalisation / source priors, `evaluate_pqa` (Table 3 rows), `PQAReport` |
"""
