"""Runs calls of the real API clients against an endpoint and prints what each client returned, as JSON.

Run it with the python of the tools venv that `requirements-clients.txt` builds (it imports the real openai,
huggingface_hub, langchain-openai and litellm), never with the project's venv:

    .tools/clients/bin/python tests/harness/clients.py --url http://127.0.0.1:8080 --model tgi \\
        '[["openai_models", "KEY"], ["hub_text_generation", "KEY"]]'

A call may name its own endpoint and model, ``[call, key, url, model]``, for several endpoints in one process
(each client's import costs seconds); its answer is then under ``"<call> <key> <url>"``.

It prints one JSON object on stdout, by ``"<call> <key>"``: ``{"ok": <what the call returned>}``, or, when the
client raised, ``{"raised": <the exception's class>, "message": str(exception), ...}`` with what the exception carries
(the status, and for the OpenAI SDK its ``body``, ``type`` and ``code``). Every call is what the
client's own documentation shows; nothing here reaches past the client's public API, so an answer a
client cannot parse shows as the client's own error.

Only loopback is reached: LiteLLM reads its model cost map from the copy in its wheel
(``LITELLM_LOCAL_MODEL_COST_MAP``, litellm/litellm_core_utils/get_model_cost_map.py at 1.110.2) instead
of fetching it, and the Hub client is given the endpoint's URL (``base_url``), never a model id to resolve
(huggingface_hub's offline mode would refuse even loopback: huggingface_hub/utils/_http.py at 2.4.0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PROMPT = "Hello there"
TOKENS = 3

Call = Callable[[argparse.Namespace], Any]


def _openai(args: argparse.Namespace) -> Any:
    import openai

    # max_retries 0: an error is the router's answer, not the last of the SDK's retries.
    return openai.OpenAI(base_url=f"{args.url}/v1", api_key=args.key, max_retries=0)


def openai_models(args: argparse.Namespace) -> Any:
    return [model.id for model in _openai(args).models.list()]


def openai_chat(args: argparse.Namespace) -> Any:
    answer = _openai(args).chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS)
    return {"text": answer.choices[0].message.content, "completion_tokens": answer.usage.completion_tokens}


def openai_completions(args: argparse.Namespace) -> Any:
    answer = _openai(args).completions.create(model=args.model, prompt=PROMPT, max_tokens=TOKENS)
    return {"text": answer.choices[0].text, "completion_tokens": answer.usage.completion_tokens}


def openai_chat_stream(args: argparse.Namespace) -> Any:
    stream = _openai(args).chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, stream=True,
        stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        pieces += [choice.delta.content or "" for choice in chunk.choices]
        usage = chunk.usage.completion_tokens if chunk.usage else usage
    return {"text": "".join(pieces), "completion_tokens": usage}


def openai_completions_stream(args: argparse.Namespace) -> Any:
    stream = _openai(args).completions.create(
        model=args.model, prompt=PROMPT, max_tokens=TOKENS, stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        pieces += [choice.text for choice in chunk.choices]
        usage = chunk.usage.completion_tokens if chunk.usage else usage
    return {"text": "".join(pieces), "completion_tokens": usage}


def openai_embeddings(args: argparse.Namespace) -> Any:
    """A route neither engine's endpoint serves: the router's own 404."""
    return _openai(args).embeddings.create(model=args.model, input=PROMPT).model_dump()


def _hub(args: argparse.Namespace) -> Any:
    from huggingface_hub import InferenceClient

    return InferenceClient(base_url=args.url, api_key=args.key)


def hub_text_generation(args: argparse.Namespace) -> Any:
    return _hub(args).text_generation(PROMPT, max_new_tokens=TOKENS)


def hub_text_generation_stream(args: argparse.Namespace) -> Any:
    # The stream reads through the client's connection: the client must outlive it.
    client = _hub(args)
    return "".join(client.text_generation(PROMPT, max_new_tokens=TOKENS, stream=True))


def hub_text_generation_details(args: argparse.Namespace) -> Any:
    answer = _hub(args).text_generation(PROMPT, max_new_tokens=TOKENS, details=True)
    return {"text": answer.generated_text, "generated_tokens": answer.details.generated_tokens}


def hub_chat(args: argparse.Namespace) -> Any:
    answer = _hub(args).chat_completion([{"role": "user", "content": PROMPT}], model=args.model, max_tokens=TOKENS)
    return {"text": answer.choices[0].message.content, "completion_tokens": answer.usage.completion_tokens}


def langchain_chat(args: argparse.Namespace) -> Any:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=f"{args.url}/v1", api_key=args.key, model=args.model, max_tokens=TOKENS,
                      max_retries=0)
    answer = chat.invoke(PROMPT)
    return {"text": answer.content, "completion_tokens": (answer.usage_metadata or {}).get("output_tokens")}


def langchain_chat_stream(args: argparse.Namespace) -> Any:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=f"{args.url}/v1", api_key=args.key, model=args.model, max_tokens=TOKENS,
                      max_retries=0, stream_usage=True)
    pieces, usage = [], None
    for chunk in chat.stream(PROMPT):
        pieces.append(chunk.content)
        usage = chunk.usage_metadata["output_tokens"] if chunk.usage_metadata else usage
    return {"text": "".join(pieces), "completion_tokens": usage}


def litellm_chat(args: argparse.Namespace) -> Any:
    import litellm

    # "openai/<model>": LiteLLM's OpenAI-compatible provider, for any server with OpenAI's API
    # (docs.litellm.ai, providers/openai_compatible).
    answer = litellm.completion(model=f"openai/{args.model}", api_base=f"{args.url}/v1", api_key=args.key,
                                messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, num_retries=0)
    return {"text": answer.choices[0].message.content, "completion_tokens": answer.usage.completion_tokens}


def litellm_chat_stream(args: argparse.Namespace) -> Any:
    import litellm

    stream = litellm.completion(model=f"openai/{args.model}", api_base=f"{args.url}/v1", api_key=args.key,
                                messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, num_retries=0,
                                stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        pieces += [choice.delta.content or "" for choice in chunk.choices]
        found = getattr(chunk, "usage", None)
        usage = found.completion_tokens if found else usage
    return {"text": "".join(pieces), "completion_tokens": usage}


CALLS: dict[str, Call] = {call.__name__: call for call in (
    openai_models, openai_chat, openai_completions, openai_chat_stream, openai_completions_stream,
    openai_embeddings, hub_text_generation, hub_text_generation_stream, hub_text_generation_details, hub_chat,
    langchain_chat, langchain_chat_stream, litellm_chat, litellm_chat_stream)}


def describe(error: BaseException) -> dict[str, Any]:
    """What a client's exception carries: its class, message and, where it has them, the status and
    the OpenAI SDK's parsed ``body``, ``type`` and ``code``."""
    response = getattr(error, "response", None)
    return {
        "raised": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error),
        "status": getattr(error, "status_code", None) or getattr(response, "status_code", None),
        **{name: getattr(error, name) for name in ("body", "type", "code") if hasattr(error, name)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the endpoint, http://host:port, without a path, of calls that name none")
    parser.add_argument("--model", help="the model OpenAI-compatible requests name, for calls that name none")
    parser.add_argument("calls", help='a JSON list of [call, key] pairs: each call of CALLS, with the API key its '
                                      'client sends as its bearer token; the answers print as {"call key": result}; '
                                      'or [call, key, url, model], whose answer prints as "call key url"')
    args = parser.parse_args()
    results: dict[str, Any] = {}
    # One process runs every call: each client's import costs seconds (LiteLLM's most).
    for name, key, *target in json.loads(args.calls):
        url, model = target or (args.url, args.model)
        answer = " ".join([name, key, *target[:1]])
        try:
            results[answer] = {"ok": CALLS[name](argparse.Namespace(url=url, model=model, key=key))}
        except Exception as error:  # the client's error is the result
            results[answer] = describe(error)
    json.dump(results, sys.stdout, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
