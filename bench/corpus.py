"""The benchmarks' corpus: real, varied English from the docstrings, comments
and docs of the installed Python and its packages, cut into 1-10 KB
documents like FineWeb's and written as JSONL with a "text" field. The same
corpus every run (a fixed seed and a sorted walk)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sysconfig
from pathlib import Path

DOCSTRING = re.compile(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', re.S)
COMMENTS = re.compile(r"(?:^[ \t]*#[^\n]*\n)+", re.M)


def _paragraphs(path: Path) -> list[str]:
    """Prose of one file: docstrings and comment blocks of .py, all of the rest."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    if path.suffix == ".py":
        blocks = [a or b for a, b in DOCSTRING.findall(text)]
        blocks += [re.sub(r"^[ \t]*# ?", "", m, flags=re.M) for m in COMMENTS.findall(text)]
    else:
        blocks = [text]
    return [p.strip() for b in blocks for p in re.split(r"\n\s*\n", b) if len(p.strip()) >= 40]


def build_corpus(path: Path, mb: float) -> None:
    """Pack unique paragraphs of installed sources into 1-10 KB documents."""
    roots = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    rng, seen = random.Random(0), set()  # fixed seed and sorted walk: same corpus every run
    budget, doc, target = int(mb * 1e6), [], 0
    with open(path, "w", encoding="utf-8") as out:
        for root in roots:
            for dirpath, dirnames, files in os.walk(root):
                dirnames.sort()
                for name in sorted(f for f in files if f.endswith((".py", ".rst", ".md", ".txt"))):
                    for para in _paragraphs(Path(dirpath, name)):
                        key = hashlib.blake2b(para.encode(), digest_size=8).digest()
                        if key in seen:  # license headers repeat in thousands of files
                            continue
                        seen.add(key)
                        doc.append(para)
                        target = target or int(rng.lognormvariate(8.2, 0.6))  # median ~3.6 KB
                        if sum(map(len, doc)) < min(max(target, 1000), 10_000):
                            continue
                        budget -= out.write(json.dumps({"text": "\n\n".join(doc)}) + "\n")
                        doc, target = [], 0
                        if budget <= 0:
                            return
    raise SystemExit(f"only {mb - budget / 1e6:.1f} MB of text found; ask for fewer --mb")
