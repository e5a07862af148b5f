"""Drives a tensorfold server with the official `openai` Python client (STYLE.md section 13).

Usage: python3 openai_client.py BASE_URL API_KEY MODEL EXPECTED_TEXT

The server must answer every request with EXPECTED_TEXT (the Rust test runs it over a fake
engine scripted to say that). Checks: model list, chat and completions (whole and streamed,
with include_usage), the return_token_ids extension, and that errors surface as the client's
typed exceptions (400 BadRequestError with `param`, 404 NotFoundError, 401
AuthenticationError). Exits non-zero with a message on the first failure.
"""

import sys

import openai


def check(cond, what):
    if not cond:
        sys.exit(f"openai client check failed: {what}")


def main():
    base, key, model, want = sys.argv[1:5]
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Hi"}]

    ids = [m.id for m in client.models.list()]
    check(ids == [model], f"models.list gave {ids}")

    r = client.chat.completions.create(model=model, messages=messages, max_tokens=50)
    check(r.choices[0].message.content == want, f"chat content {r.choices[0].message.content!r}")
    check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
    check(r.usage.completion_tokens > 0, f"usage {r.usage}")
    check(r.usage.prompt_tokens_details.cached_tokens == 0, f"cached tokens {r.usage}")

    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    check(text == want, f"streamed chat {text!r}")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"stream usage {usage}")

    c = client.completions.create(model=model, prompt="Hi", max_tokens=50)
    check(c.choices[0].text == want, f"completion text {c.choices[0].text!r}")
    text = "".join(ch.choices[0].text for ch in client.completions.create(model=model, prompt="Hi", max_tokens=50, stream=True) if ch.choices)
    check(text == want, f"streamed completion {text!r}")

    r = client.chat.completions.create(model=model, messages=messages, extra_body={"return_token_ids": True})
    extra = r.model_extra or {}
    check(isinstance(extra.get("prompt_token_ids"), list), f"prompt_token_ids missing: {extra}")
    check(len(r.choices[0].model_extra.get("token_ids", [])) == r.usage.completion_tokens, "token_ids")

    try:
        client.chat.completions.create(model=model, messages=messages, n=2)
        check(False, "n=2 was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "n", f"n=2 error {e.body}")
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        check(False, "an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.body.get("code") == "model_not_found", f"unknown model error {e.body}")
    try:
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
