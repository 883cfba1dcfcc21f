"""The two ends of every benchmark plot: matplotlib on the file-only Agg backend (optional: a benchmark without
matplotlib still writes its JSON), and saving a figure as a PNG next to the results."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any | None:
    """`matplotlib.pyplot` on the Agg backend, or None (with a line saying so) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Lay `fig` out, write it to `path` (folders created) and close it; returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
