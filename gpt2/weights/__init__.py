"""Weights to start from or sample from, whatever wrote them (#60): a Hugging Face GPT-2
directory, llm.c's model `.bin`, or a checkpoint of one of our runs, each read into our GPT.

    readers.py a GPT2LMHeadModel directory (config.json and model.safetensors or pytorch_model.bin),
               llm.c's model file (its header, as llm.c's gpt2_124M.bin and our export write it)
    source.py  which of them a path or URL is, and loading it: the shape comes from the weights
    init.py    train.init_from: the weights fetched once into the root, the run's config resolved from them

Every reader refuses, in one line naming the file, what is not GPT-2's: another architecture, a
vocabulary other than GPT-2's 50257 (padded to 50304 or not), a truncated or damaged file.
"""
