"""Command line of the label-prompt text embeddings: ``python -m monai_vce.text_embeddings ...``.

The implementation lives with the networks, :mod:`monai_vce.networks.text_embeddings`; this module keeps the
command line (and the names it always exported) where users call them.
"""

from __future__ import annotations

import sys

from monai_vce.networks.text_embeddings import (  # noqa: F401 (_require_text_tower: kept importable from here)
    _require_text_tower,
    compute_text_embeddings,
    load_text_embeddings,
    main,
    save_text_embeddings,
)

__all__ = ["compute_text_embeddings", "save_text_embeddings", "load_text_embeddings", "main"]

if __name__ == "__main__":
    sys.exit(main())
