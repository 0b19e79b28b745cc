"""Reads optimum-neuron's Hub cache registry for ``neuron-serving plan``, through huggingface_hub,
as ``optimum-cli neuron cache lookup`` does; what the files mean is
:mod:`neuron_serving.plan.hub_cache`'s, which takes them as plain values.

huggingface_hub (0.34.4, the version in TGI 3.3.5's image) is imported only here, when ``plan``
reads the cache: it brings the Hub's endpoint (``HF_ENDPOINT``), token (``HF_TOKEN`` or the stored
login), offline mode (``HF_HUB_OFFLINE``) and the pagination of tree listings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import requests
from huggingface_hub import HfApi, configure_http_backend, constants, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError
from huggingface_hub.hf_api import RepoFile

from ..plan.engines.base import ServingImage
from ..plan.host import PUBLIC_HUB_CACHE
from ..plan.hub_cache import (
    CACHE_REPO_VARIABLE,
    HubCache,
    compiler_folder,
    entry_paths,
    parse_entry,
    registry_path,
)

TIMEOUT_S = 5.0
"""Seconds each request to the Hub may wait to connect or for an answer, so that a network that
drops packets cannot hang ``plan``. huggingface_hub 0.34.4 lists a repository's tree without a
timeout (src/huggingface_hub/utils/_pagination.py, ``paginate``: ``session.get`` with none), so
:func:`read_hub_cache` gives its sessions one (:class:`_TimeoutAdapter`)."""


class CacheUnreadable(Exception):
    """The cache could not be read; the message says why, in one line."""


class _TimeoutAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter with a default timeout for the requests that give none."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self._timeout
        return super().send(request, *args, **kwargs)


def _bounded_session(timeout: float) -> requests.Session:
    session = requests.Session()
    for scheme in ("http://", "https://"):
        session.mount(scheme, _TimeoutAdapter(timeout))
    return session


def cache_repo() -> str:
    """The cache repository: ``CUSTOM_CACHE_REPO`` when set, else the public one, as optimum-neuron
    chooses (optimum/neuron/utils/cache_utils.py ``get_hf_hub_cache_repos``, v0.3.0 and v0.4.5)."""
    return os.environ.get(CACHE_REPO_VARIABLE) or PUBLIC_HUB_CACHE


def read_hub_cache(image: ServingImage, model_type: str, model_ids: Sequence[str], *,
                   timeout: float = TIMEOUT_S) -> HubCache:
    """What the cache's registry holds of ``model_ids`` (of ``model_type``) for ``image``'s
    optimum-neuron and compiler: the top-level folder of the compiler (listed without recursion),
    then each model's folder of the registry (recursively), then each entry's file.

    Raises :class:`CacheUnreadable` in offline mode and when the Hub cannot be reached or refuses.
    """
    if constants.HF_HUB_OFFLINE:
        raise CacheUnreadable("offline mode is on: HF_HUB_OFFLINE")
    repo = cache_repo()
    # huggingface_hub's sessions come from one factory for the whole process (utils/_http.py,
    # configure_http_backend and get_session); the default one is put back when done.
    configure_http_backend(lambda: _bounded_session(timeout))
    try:
        api = HfApi()
        folder = compiler_folder((item.path for item in api.list_repo_tree(repo)), image.neuronx_cc)
        if folder is None:
            return HubCache.of(image, repo, ())
        registry = registry_path(folder, image.export.version)
        listed: list[str] = []
        for model_id in model_ids:
            try:
                listed += [item.path for item in api.list_repo_tree(repo, f"{registry}/{model_type}/{model_id}",
                                                                    recursive=True) if isinstance(item, RepoFile)]
            except EntryNotFoundError:
                continue  # the Hub's answer for a folder that does not exist: no entry of that model
        layouts = []
        with TemporaryDirectory() as directory:
            for path in entry_paths(listed, registry, model_type, model_ids):
                local = hf_hub_download(repo, path, local_dir=directory, etag_timeout=timeout)
                layout = parse_entry(Path(local).read_text(encoding="utf-8"))
                if layout is not None:
                    layouts.append(layout)
        return HubCache.of(image, repo, layouts)
    except HfHubHTTPError as err:
        if err.response is None:  # hf_hub_download's LocalEntryNotFoundError: the Hub did not answer
            raise CacheUnreadable(f"cannot read {repo} on {constants.ENDPOINT}: {_first_line(err)}") from None
        raise CacheUnreadable(f"{repo} on {constants.ENDPOINT} answered {err.response.status_code}: "
                              f"{_first_line(err)}") from None
    except requests.Timeout:
        raise CacheUnreadable(f"{constants.ENDPOINT} did not answer within {timeout:g} s") from None
    except (requests.RequestException, OSError) as err:
        raise CacheUnreadable(f"cannot reach {constants.ENDPOINT}: {type(err).__name__}") from None
    finally:
        configure_http_backend()


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
