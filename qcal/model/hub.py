"""Hugging Face Hub model ids (`org/name[@revision]`) as local snapshot folders.

Resolved through huggingface_hub's own cache (models--org--name/snapshots/<sha>, with
refs/<branch> naming the commit): offline (HF_HUB_OFFLINE, which qcal's CLI sets unless the
user set it) from the cache only; online, downloading what is missing. Only safetensors
weights are fetched (qcal never reads pickle files), plus configs, tokenizer files, chat
templates and the model card (for the licence). A missing, gated or unreachable model is
one line saying what to do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from qcal.errors import ModelNotFoundError

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                    r"(?:@(?P<revision>[\w./-]+))?$")
ALLOW_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer.model",
                  "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja", "README.md", "LICENSE*"]


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """(repo id, revision) when `spec` has the form of a Hub model id, else None."""
    match = HUB_ID.match(spec)
    if not match or spec.startswith((".", "/", "~")):
        return None
    return match.group("repo"), match.group("revision")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _cache_dir() -> str | None:
    """The Hub cache as the environment names it now (huggingface_hub reads it only once,
    at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def snapshot_dir(spec: str) -> Path:
    """The local snapshot folder of Hub model `spec` (`org/name[@revision]`)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    parsed = parse_hub_id(spec)
    if parsed is None:
        raise ModelNotFoundError(f"{spec!r} is neither a folder nor a Hub id (org/name[@revision])")
    repo, revision = parsed
    offline = _offline()
    try:
        folder = snapshot_download(repo, revision=revision, allow_patterns=ALLOW_PATTERNS,
                                   cache_dir=_cache_dir(), local_files_only=offline)
    except GatedRepoError:
        raise ModelNotFoundError(f"{repo} is gated on the Hub: accept its terms on "
                                 f"huggingface.co/{repo} and log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(f"{repo} is not a model on the Hub (or it is private and you are "
                                 "not logged in); check the name or pass a local folder") from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{repo} has no revision {revision!r} on the Hub") from None
    except LocalEntryNotFoundError:
        where = _cache_dir() or "the Hugging Face cache"
        if offline:
            raise ModelNotFoundError(
                f"{spec} is not in {where} and qcal runs offline (HF_HUB_OFFLINE=1): download it "
                f"once with `hf download {repo}`, or set HF_HUB_OFFLINE=0 to let qcal fetch it"
            ) from None
        raise ModelNotFoundError(f"{spec}: the Hub cannot be reached and it is not in {where}; "
                                 "check the network or pass a local folder") from None
    except HfHubHTTPError as err:
        raise ModelNotFoundError(f"{spec}: the Hub answered {str(err).splitlines()[0][:120]}") from None
    return Path(folder)
