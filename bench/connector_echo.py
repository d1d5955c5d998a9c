"""The connector the benchmark calls: the smallest useful handler."""

from toolcage.sdk import Context, tool


@tool
def echo(ctx: Context, text: str) -> dict:
    """Return the text."""
    return {"text": text}
