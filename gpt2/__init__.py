"""GPT-2 (124M) from scratch: the pure library (never imports prefect)."""

from gpt2.process.cpu_memory import use_huge_pages

# Before any module of ours imports torch: it reads this at its first CPU allocation.
use_huge_pages()
