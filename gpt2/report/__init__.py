"""Figures: the runs-comparison picture (`gpt2 report`), the published numbers
it is drawn against, and the GPU figures on record.

    comparison.py        what the figure compares: each run's curves, panels, reference lines
    figure.py            drawing it
    reference_lines.py   published GPT-2 124M figures, by the data they were measured on
    figures_on_record.py bench/results.jsonl: each GPU figure with its commit and device
"""
