"""The model: backbones (`backbone`), towers and the bi-encoder (`model`), heads (`heads`), aspect fusion and
value tables (`fusion`, `aspect_tables`, `aspect_vocabulary`), structured outputs (`outputs`), tokenisation
(`tokenization`, `batching`) and explanations (`explain`, `calibration`)."""
