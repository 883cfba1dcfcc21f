"""The aspect papers' experiment (paper 000 MADRAL, paper 001 MURAL) in process: data -> model -> pretrain
-> fine-tune -> evaluate."""
