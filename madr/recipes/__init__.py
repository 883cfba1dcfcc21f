"""One experiment per paper family: config + train + evaluate (aspects: papers 000/001, pqa: paper 002,
multitask: paper 004)."""
