"""MkDocs hook: the benchmark figures and data under `bench/results/` belong to the site, so that the pages
link them where they lie in the repository (`../bench/results/...` from `docs/`), which GitHub shows too, and
`mkdocs build --strict` checks those links like any other."""

from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for p in sorted((root / "bench" / "results").rglob("*")):
        if p.is_file() and p.suffix in (".png", ".json", ".jsonl", ".csv"):
            rel = p.relative_to(root).as_posix()
            f = File(f"../{rel}", config["docs_dir"], config["site_dir"], False, dest_uri=rel)
            f.inclusion = InclusionLevel.INCLUDED  # a path that starts with "." would be left out
            files.append(f)
    return files
