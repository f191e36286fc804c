"""The soak's figure: faults injected by kind beside what they cost (pipelines
completed, data lost, duplicates, other problems), titled with the seed and
the commit so it can be traced to the code it measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(result: dict[str, Any], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    faults = result["faults"] or {"(none)": 0}
    fig = Figure(figsize=(10, 4.8))
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    kinds = sorted(faults)
    left.barh(kinds, [faults[k] for k in kinds], color="#4c72b0")
    left.set_title(f"{result['faults_total']} faults injected, by kind")
    left.set_xlabel("faults")
    left.invert_yaxis()
    outcome = {"pipelines": result["pipelines"], "completed": result["pipelines_completed"],
               "reruns (disk full)": result["reruns"], "data lost": result["lost"],
               "duplicates": result["duplicates"], "other problems": result["problems"]}
    colors = ["#8c8c8c", "#55a868", "#dd8452", "#c44e52", "#c44e52", "#c44e52"]
    bars = right.bar(range(len(outcome)), list(outcome.values()), color=colors)
    right.set_xticks(range(len(outcome)), list(outcome), rotation=25, ha="right")
    right.bar_label(bars)
    right.set_title("what the pipelines kept")
    stopped = f"; {result['interrupted']}" if result.get("interrupted") else ""
    fig.suptitle(f"fault soak: seed {result['seed']}, commit {str(result['commit'])[:12]}, "
                 f"{result['elapsed_s'] / 60:.0f} min{stopped}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path
