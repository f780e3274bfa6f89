"""The HTTP APIs a model is asked through, shared by `harnessrl serve` (serve/) and the recording
endpoint of external harnesses (harness/recording.py), so that both read and answer a request
with the same code.

    chat.py      OpenAI's chat completions format (requests in, responses out, errors; ServeError)
    responses.py OpenAI's Responses API as a front of the chat path (requests, items, events)
    messages.py  Anthropic's Messages API as a front of the chat path (blocks, events, errors)
    gemini.py    Google's Gemini API as a front of the chat path (contents and parts, SSE chunks, errors)
    streaming.py tokens as the engine samples them -> text deltas
    replies.py   one admitted request answered as JSON or as an event stream
    http.py      BackgroundServer (an app on a thread), socket helpers, request validation messages
    auth.py      the admin key that locks a server's adapter routes (Authorization: Bearer KEY)

This package imports neither serve/ nor harness/: both build on it.
"""
