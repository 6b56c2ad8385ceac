"""MkDocs hook of the documentation site (``hooks:`` in mkdocs.yml).

It adds the reference pages that :mod:`reference` generates from the code (configuration, CLI,
HTTP API, errors) to the site's files at build time, so they are never committed and never
drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference  # a sibling module, found through the path above
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    for path, generate in reference.PAGES.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            raise RuntimeError(
                f"docs/{path} is generated from the code by tools/docs/reference.py; remove "
                "the committed file"
            )
        files.append(File.generated(config, path, content=generate() + "\n"))
    return files
