"""The tests never reach the Hugging Face hub: `datasets` works offline, caching into a temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Set before anything imports `datasets` (it reads these once, at import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", str(Path(tempfile.gettempdir()) / "agenttune-tests" / "hf-datasets"))
