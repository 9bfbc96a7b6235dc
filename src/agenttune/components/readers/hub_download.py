"""Save a Hugging Face dataset as local Parquet files (what `agenttune data download` does).

Layout: `DIR/<dataset>/<subset>/<split>-00000-of-00001.parquet`, the same names the hub uses, so the
`file` and `huggingface` readers load the directory offline and the gsm8k columns preset still
applies (the path names the dataset).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from agenttune.errors import UserError


@dataclass
class SavedSplit:
    subset: str
    split: str
    file: Path
    rows: int
    dataset: Any  # the datasets.Dataset, for previews

    def preview(self, count: int) -> list[dict[str, Any]]:
        return [self.dataset[index] for index in range(min(count, self.rows))]


def download_dataset(dataset: str, directory: Path, *, subset: str | None = None) -> list[SavedSplit]:
    """Load every split of `dataset` (every subset, or just `subset`) and write each as Parquet."""
    import datasets  # heavy: only when downloading

    subsets = [subset] if subset else _subset_names(datasets, dataset)
    saved = []
    for name in subsets:
        splits = _load(datasets, dataset, name)
        target = directory / local_name(dataset) / name
        for split, data in splits.items():
            file = target / f"{split}-00000-of-00001.parquet"
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
                data.to_parquet(str(file))
            except OSError as error:
                raise UserError(f"Cannot write {str(file)!r}: {error.strerror or error}.",
                                hint="Pass a writable directory with --path.") from error
            saved.append(SavedSplit(name, split, file, len(data), data))
    return saved


def local_name(dataset: str) -> str:
    """The sub-directory a dataset is saved under: the hub name, or a local directory's own name."""
    if Path(dataset).exists():
        return Path(dataset).resolve().name
    parts = [part for part in PurePosixPath(dataset).parts if part not in ("", "/", ".", "..")]
    return "/".join(parts) or "dataset"


def _subset_names(datasets: Any, dataset: str) -> list[str]:
    try:
        return list(datasets.get_dataset_config_names(dataset))
    except ConnectionError as error:
        raise _offline(dataset, error) from error
    except Exception as error:
        raise UserError(f"Cannot list the subsets of dataset {dataset!r}: {type(error).__name__}: {error}",
                        hint="Check the dataset name, or pass --name SUBSET.") from error


def _load(datasets: Any, dataset: str, subset: str) -> Any:
    try:
        return datasets.load_dataset(dataset, subset)
    except ConnectionError as error:
        raise _offline(dataset, error) from error
    except Exception as error:
        raise UserError(f"Cannot load dataset {dataset!r} (subset {subset!r}): {type(error).__name__}: {error}",
                        hint="Check the dataset name and --name.") from error


def _offline(dataset: str, error: Exception) -> UserError:
    return UserError(
        f"Cannot download dataset {dataset!r}: the Hugging Face Hub is not reachable ({error}).",
        hint="Run this where there is a network (unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, or set HF_ENDPOINT "
        "to a mirror), then copy the directory here.",
    )
