"""One reader per public source (Home Depot, ESCI, hetPQA, XGLUE / XNLI / Tatoeba) as madr records."""
