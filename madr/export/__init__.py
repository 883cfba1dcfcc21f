"""Models out of madr: a sentence-transformers directory (`sentence_transformers.py`), an ONNX graph of a tower
with an onnxruntime encoder (`onnx.py`) and int8 towers, torch or onnxruntime (`quantize.py`). They import their
optional dependencies (`pip install "madr[export]"`) only when called."""
