"""The hub, asked once: a hub id minimodel is given (``bridge.source``, ``data.source_tokenizer``) is checked before
transformers asks for it (which, for a file it has not cached, retries for half a minute without a network): found
in the local Hugging Face cache, refused at once where the environment says offline, otherwise one short request.
Needs ``huggingface_hub`` (with transformers); it is imported only inside the functions."""

from __future__ import annotations

import os

from minimodel.errors import CheckpointError

HUB_TIMEOUT = 5.0  # seconds: the one attempt at the hub for an id not in the local cache


def first_line(e: BaseException, limit: int = 300) -> str:
    """What an exception of another library says, on one line (its lines joined: transformers' validation errors
    say what is wrong on their second line), cut at ``limit`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def hub_offline() -> bool:
    """Whether the environment says there is no hub to ask: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to
    a true value now, or when huggingface_hub was imported."""
    import huggingface_hub.constants as hub

    now = any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in ("HF_HUB_OFFLINE",
                                                                                    "TRANSFORMERS_OFFLINE"))
    return now or bool(hub.HF_HUB_OFFLINE)


def check_hub(name: str, filename: str = "config.json") -> None:
    """A hub id (``name``), before transformers asks the hub for it (which, for a file it has not cached, retries for
    half a minute without a network): in the local Hugging Face cache, or else, where the environment says offline
    (``hub_offline``), a ``CheckpointError`` at once; otherwise one request of ``HUB_TIMEOUT`` seconds, without
    retries, and a ``CheckpointError`` when the hub cannot be reached or does not know the id. ``filename``: the file
    the id must have (``config.json`` for a model; a tokenizer's ``tokenizer_config.json``)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError

    def refused(why: str) -> CheckpointError:
        return CheckpointError(f"{name}: no such local directory, and not a model id the hub answers for here "
                               f"({why}); check the path or id, or fetch the model again")

    try:
        if isinstance(try_to_load_from_cache(name, filename), str):
            return
        url = hf_hub_url(name, filename)
    except Exception as e:  # not a valid repository id (huggingface_hub's validation)
        raise refused(first_line(e)) from None
    if hub_offline():
        raise refused("not in the local Hugging Face cache, and HF_HUB_OFFLINE is set, so the hub is not asked")
    try:
        get_hf_file_metadata(url, timeout=HUB_TIMEOUT)  # one request (huggingface_hub retries none of it)
    except EntryNotFoundError:  # the id is there without this file: transformers' load says what it lacks
        return
    except Exception as e:  # no network, a timeout, an unknown or private id
        raise refused(f"one attempt at the hub, {HUB_TIMEOUT:g} s at most: {first_line(e, 200)}") from None
