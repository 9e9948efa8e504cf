"""lm-eval imports this file by path (`custom_dataset: !function loader.load`)."""

from typing import Any


def load(**kwargs: Any) -> Any:
    from qcal.eval.local_tasks import load_dataset

    return load_dataset(**kwargs)
