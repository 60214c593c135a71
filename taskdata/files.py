"""Reading a task file's rows: JSONL (one JSON object per line; a malformed line is a named bad row), a JSON
list of objects (`[{...}, ...]`, as DeepScaleR and others ship; a `.json` file whose first character is `[`),
Parquet (pyarrow, batch by batch) and folders written by `datasets`' `save_to_disk` (`load_from_disk`: a
Dataset, or one split of a DatasetDict)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from config.data import DataSource


class DataError(ValueError):
    """A task file or source cannot be used; the message names the file (and row and field)."""


def kind_of(path: Path) -> str:
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return "hf"
        raise DataError(f"{path}: a folder, but not one written by datasets' save_to_disk "
                        f"(no dataset_info.json or dataset_dict.json)")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".jsonl", ".json", ".jsonl.gz"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise DataError(f"{path}: unknown file type {suffix!r} (JSONL, Parquet, or a save_to_disk folder)")


def rows(src: DataSource, default_split: str) -> Iterator[tuple[int, dict | str]]:
    """(row number, row) for every row; a row that is not an object comes as the reason (a string).
    Row numbers count from 1 (a JSONL file's line numbers)."""
    path = Path(src.path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_file() and path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty")
    kind = kind_of(path)
    it = {"jsonl": _jsonl, "parquet": _parquet, "hf": _hf}[kind](path, src.split or default_split)
    for n, (i, row) in enumerate(it):
        if src.limit and n >= src.limit:
            return
        yield i, row


def columns(src: DataSource, default_split: str) -> set[str]:
    """The top-level fields of the first rows (layout detection)."""
    cols: set[str] = set()
    for n, (_, row) in enumerate(rows(src, default_split)):
        if isinstance(row, dict):
            cols |= set(row)
        if n >= 20:
            break
    return cols


def _jsonl(path: Path, split: str) -> Iterator[tuple[int, dict | str]]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            head = f.read(4096).lstrip("\ufeff \t\r\n")[:1]
            f.seek(0)
            if head == "[":  # a JSON list of rows, not one object per line
                yield from _json_list(path, f)
                return
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    yield lineno, f"not valid JSON ({e.msg} at column {e.colno})"
                    continue
                yield lineno, obj if isinstance(obj, dict) else f"expected an object, got {type(obj).__name__}"
    except (UnicodeDecodeError, OSError, EOFError) as e:  # binary garbage, a bad gzip stream, unreadable
        raise DataError(f"{path}: not a text JSON/JSONL file ({type(e).__name__}: {e}); JSONL, a JSON list, "
                        f"Parquet or a save_to_disk folder") from None


def _json_list(path: Path, f) -> Iterator[tuple[int, dict | str]]:
    """A file holding one JSON list: its items, numbered from 1."""
    try:
        items = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: starts with '[' but is not a valid JSON list ({e.msg} at line {e.lineno}, "
                        f"column {e.colno})") from None
    for i, obj in enumerate(items, 1):
        yield i, obj if isinstance(obj, dict) else f"item {i}: expected an object, got {type(obj).__name__}"


def _parquet(path: Path, split: str) -> Iterator[tuple[int, dict | str]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    i = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            i += 1
            yield i, row


def _hf(path: Path, split: str) -> Iterator[tuple[int, dict | str]]:
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{path}: datasets could not load it ({type(e).__name__}: {e})") from None
    if isinstance(ds, DatasetDict):
        names = list(ds)
        pick = split if split in ds else (names[0] if len(names) == 1 else "test" if "test" in ds else None)
        if pick is None:
            raise DataError(f"{path}: a DatasetDict with splits {names} and none named {split!r}: set the source's "
                            f"split")
        ds = ds[pick]
    for i, row in enumerate(ds, 1):
        yield i, row
