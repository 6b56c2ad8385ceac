from typing import Any


def document() -> dict[str, Any]:
    return {}
