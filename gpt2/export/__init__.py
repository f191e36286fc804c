"""Checkpoint export: a Hugging Face GPT2LMHeadModel directory and the llm.c
model and tokenizer files (see `gpt2.export.writer` for the layout)."""
