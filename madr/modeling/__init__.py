"""The model: backbones, towers and heads, aspect fusion and value tables, structured outputs,
tokenisation and explanations (DESIGN.md, "Model library")."""
