"""Models out of madr: a sentence-transformers directory (`sentence_transformers.py`) and an ONNX graph of a
tower with an onnxruntime encoder (`onnx.py`). Both import their optional dependencies (`pip install
"madr[export]"`) only when called."""
